"""The Qwen3 text encoder the current-line families share (FLUX.2 [klein], Z-Image): loading it
without its language-model head, tokenising prompts as one user turn of its chat template, and
running it for its hidden states. Each family picks the layers it reads and what it keeps.

Imported on both library lines (the families' modules are); transformers' Qwen3 classes are
imported inside the functions, since transformers 4.46 (the recipe line) has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from fastvideo.models.parts import EncoderHandle


@dataclass
class TextEncoder(EncoderHandle):
    """The Qwen3 decoder (its hidden states; the language-model head is not needed) and its tokenizer."""

    tokenizer: object
    model: torch.nn.Module


def load_text_encoder(root: str | Path, device="cpu", dtype=torch.float32) -> TextEncoder:
    """root/text_encoder's Qwen3 decoder without its head (Qwen3-8B's untied head is 1.2 GB of bf16
    the embeddings never use) and root/tokenizer. The caller checks the folder first."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(root, subfolder="tokenizer")
    model = Qwen3ForCausalLM.from_pretrained(root, subfolder="text_encoder", torch_dtype=dtype).model
    return TextEncoder(tokenizer, model.requires_grad_(False).eval().to(device))


def chat_ids(tokenizer, prompts: list[str], max_sequence_length: int,
             enable_thinking: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt as one user turn of the chat template with the generation prompt (and
    ``enable_thinking`` as the pipeline passes it), padded / truncated to max_sequence_length.
    -> (input_ids, attention_mask), each [B, L] int64."""
    ids, masks = [], []
    for prompt in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=enable_thinking)
        enc = tokenizer(text, return_tensors="pt", padding="max_length", truncation=True,
                        max_length=max_sequence_length)
        ids.append(enc["input_ids"])
        masks.append(enc["attention_mask"])
    return torch.cat(ids), torch.cat(masks)


@torch.no_grad()
def hidden_states(enc: TextEncoder, prompts: list[str], max_sequence_length: int,
                  enable_thinking: bool) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The encoder's hidden states on the chat-templated prompts: (every layer's output, index 0 the
    embedding, each [B, L, H] in the encoder's dtype; the attention mask [B, L] int64 on its device)."""
    ids, mask = chat_ids(enc.tokenizer, list(prompts), max_sequence_length, enable_thinking)
    ids, mask = ids.to(enc.device), mask.to(enc.device)
    out = enc.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    return out.hidden_states, mask
