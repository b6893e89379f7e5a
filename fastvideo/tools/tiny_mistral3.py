"""A tiny Mistral-3 text encoder and its processor, built offline: the text side of the tiny FLUX.2
[dev] folder (``python -m fastvideo.tools.make_tiny_flux2 OUT --variant dev``).

FLUX.2 [dev] encodes prompts with Mistral-Small-3.1-24B (Mistral3ForConditionalGeneration: a
Pixtral vision tower, a projector and a 40-layer Mistral decoder 5120 wide) behind a
PixtralProcessor, whose chat template turns the pipeline's system message and user turn into
``<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]``. Here: the same classes, the decoder
with the real 40 layers (the pipeline reads layers 10, 20 and 30), 24 wide (the tiny klein's
Qwen3 is 16: their embeddings differ in width, as the real ones), a one-layer vision tower, and a
byte-level BPE tokenizer with Mistral's control tokens and a chat template written here (nothing
from the hub). Needs the current library line (transformers 5).
"""

from __future__ import annotations

from pathlib import Path

MISTRAL_WIDTH, MISTRAL_LAYERS = 24, 40  # Mistral-Small-3.1-24B: 40 layers, 5120 wide (24: not klein's 16)
# Mistral's control tokens as its tokenizer numbers the first ones (<unk> 0, <s> 1, </s> 2, ...).
CONTROL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
           "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
           "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]
# Mistral-Small-3.1's chat template, reduced to what the pipelines send: an optional system turn
# (text string or a list of text blocks), user turns (string or blocks; image blocks become [IMG])
# and assistant turns; the beginning-of-sequence token first.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}{%- set system_message = messages[0]['content'] -%}"
    "{%- else -%}{%- set system_message = messages[0]['content'][0]['text'] -%}{%- endif -%}"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{%- if message['content'] is string -%}{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- else -%}{{- '[INST]' }}{%- for block in message['content'] -%}"
    "{%- if block['type'] == 'text' -%}{{- block['text'] }}"
    "{%- elif block['type'] in ['image', 'image_url'] -%}{{- '[IMG]' }}{%- endif -%}"
    "{%- endfor -%}{{- '[/INST]' }}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- if message['content'] is string -%}{{- message['content'] + eos_token }}"
    "{%- else -%}{{- message['content'][0]['text'] + eos_token }}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def _bpe_tokenizer():
    """A byte-level BPE (Mistral's Tekken tokenizer is one too) with the control tokens first: one
    token per byte plus merges for a space before a letter and the letter pairs of English words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from fastvideo.tools.tiny_builder import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    space = bytes_to_unicode()[ord(" ")]
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges = [(space, c) for c in letters] + [(a, b) for a in letters for b in letters]
    tokens = CONTROL + symbols + ["".join(m) for m in merges]
    vocab = {t: i for i, t in enumerate(tokens)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(CONTROL)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=131072)


def write_mistral3_processor(out: Path) -> int:
    """The PixtralProcessor (a Pixtral image processor, the tokenizer, the chat template) saved to
    ``out``; returns the vocabulary size."""
    from transformers import PixtralImageProcessor, PixtralProcessor

    out.mkdir(parents=True, exist_ok=True)
    tok = _bpe_tokenizer()
    images = PixtralImageProcessor(size={"longest_edge": 64}, patch_size={"height": 16, "width": 16})
    proc = PixtralProcessor(image_processor=images, tokenizer=tok, patch_size=16, spatial_merge_size=2,
                            chat_template=CHAT_TEMPLATE)
    proc.save_pretrained(out)
    return len(tok)


def mistral3(vocab: int, layers: int = MISTRAL_LAYERS):
    """Mistral3ForConditionalGeneration: a Mistral decoder 24 wide (Mistral-Small-3.1's 40 layers by
    default), grouped-query attention, untied head as the real one; a one-layer Pixtral tower."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    text = {"model_type": "mistral", "vocab_size": vocab, "hidden_size": MISTRAL_WIDTH,
            "intermediate_size": 2 * MISTRAL_WIDTH, "num_hidden_layers": layers, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "rope_theta": 1000000000.0, "tie_word_embeddings": False, "sliding_window": None,
            "pad_token_id": CONTROL.index("<pad>"), "bos_token_id": 1, "eos_token_id": 2}
    vision = {"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "head_dim": 8, "image_size": 64, "patch_size": 16, "num_channels": 3}
    config = Mistral3Config(text_config=text, vision_config=vision, image_token_index=CONTROL.index("[IMG]"),
                            spatial_merge_size=2, multimodal_projector_bias=False, tie_word_embeddings=False)
    return Mistral3ForConditionalGeneration(config)
