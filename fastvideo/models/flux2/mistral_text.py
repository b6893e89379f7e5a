"""FLUX.2 [dev]'s text side: Mistral-Small-3.1 (Mistral3ForConditionalGeneration) behind a
PixtralProcessor, as Flux2Pipeline._get_mistral_3_small_prompt_embeds (diffusers 0.42.1) uses it.

Each prompt ([IMG] markers removed) becomes a conversation of the pipeline's system message and one
user turn, both as lists of text blocks; the processor's chat template renders it
(``<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]prompt[/INST]``, no generation prompt), pads /
truncates to max_sequence_length (512 in the pipeline); the hidden states after decoder layers 10,
20 and 30 (index 0: the embedding) are stacked per token: [B, L, 3 H] (H = 5120: 15360 wide).

Only the language model is kept (the vision tower, projector and head never touch a text-only
prompt: Mistral3Model embeds the ids with the decoder's own table and runs the decoder alone).
transformers' Mistral-3 classes are imported inside the functions (this module is imported on the
recipe line too, through the family).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.models.parts import EncoderHandle

# Flux2Pipeline's text_encoder_out_layers default and its SYSTEM_MESSAGE (diffusers 0.42.1
# pipelines/flux2/system_messages.py, from black-forest-labs/flux2's src/flux2/system_messages.py).
TEXT_LAYERS = (10, 20, 30)
SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured responses focusing on "
                  "object relationships, object\nattribution and actions without speculation.")


@dataclass
class MistralEncoder(EncoderHandle):
    """The Mistral decoder (its hidden states) and the PixtralProcessor that tokenises for it."""

    processor: object
    model: torch.nn.Module


def load_text_encoder(root: str | Path, device="cpu", dtype=torch.float32) -> MistralEncoder:
    """root/text_encoder's Mistral decoder (without the vision tower and head) and root/tokenizer's
    processor. The caller checks the folder first."""
    from transformers import AutoProcessor, Mistral3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(root, subfolder="tokenizer")
    full = Mistral3ForConditionalGeneration.from_pretrained(root, subfolder="text_encoder", torch_dtype=dtype)
    decoder = full.model.language_model
    return MistralEncoder(processor, decoder.requires_grad_(False).eval().to(device))


def conversations(prompts: list[str], system_message: str = SYSTEM_MESSAGE) -> list[list[dict]]:
    """The pipeline's format_input for text prompts: a system turn and a user turn of text blocks."""
    return [[{"role": "system", "content": [{"type": "text", "text": system_message}]},
             {"role": "user", "content": [{"type": "text", "text": p.replace("[IMG]", "")}]}] for p in prompts]


def chat_ids(processor, prompts: list[str], max_sequence_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, L] of the templated conversations, padded to max_sequence_length."""
    inputs = processor.apply_chat_template(conversations(list(prompts)), add_generation_prompt=False, tokenize=True,
                                           return_dict=True, return_tensors="pt", padding="max_length",
                                           truncation=True, max_length=max_sequence_length)
    return inputs["input_ids"], inputs["attention_mask"]


@torch.no_grad()
def encode_prompts(enc: MistralEncoder, prompts: list[str], max_sequence_length: int,
                   layers: tuple[int, ...] = TEXT_LAYERS) -> torch.Tensor:
    """As Flux2Pipeline.encode_prompt: the hidden states after ``layers``, stacked per token ->
    prompt_embeds [B, L, len(layers) * H] in the encoder's dtype."""
    ids, mask = chat_ids(enc.processor, list(prompts), max_sequence_length)
    out = enc.model(input_ids=ids.to(enc.device), attention_mask=mask.to(enc.device), output_hidden_states=True,
                    use_cache=False)
    stacked = torch.stack([out.hidden_states[k] for k in layers], dim=1)  # [B, n, L, H]
    b, n, length, h = stacked.shape
    return stacked.permute(0, 2, 1, 3).reshape(b, length, n * h)
