"""Write a tiny random VideoAlign (VideoReward) folder in the released layout, built offline.

    python -m fastvideo.tools.make_tiny_videoalign OUT_DIR [--seed N] [--lora]

    OUT_DIR/model_config.json             upstream's run config: data_config (fps 2, max_frame_pixels
                                          240*320, the detailed_special template, uniform sampling),
                                          model_config (output_dim 3, the reward tokens), inference_config
                                          (each head's mean and std)
    OUT_DIR/checkpoint-1/model.pth        the reward model's state dict in upstream's names
                                          (transformers 4.45's Qwen2-VL layout + rm_head.weight), or with
                                          --lora adapter_model.safetensors + non_lora_state_dict.pth
                                          (PEFT's names: rank-2 LoRA on the attention projections,
                                          rm_head saved whole in the adapter file)
    OUT_DIR/Qwen2-VL-2B-Instruct/         the tiny base model: Qwen2VLForConditionalGeneration (a
                                          2-layer width-32 language model with multimodal RoPE, a 1-block
                                          vision tower with Qwen2-VL's 14-pixel patches, 2-frame temporal
                                          patches and 2x2 merge), its Qwen2VLProcessor (Qwen2-VL's
                                          normalisation and pixel bounds) and a byte-level BPE tokenizer
                                          (with Qwen2-VL's vision tokens and chat template); nothing from the hub

The checkpoint's embeddings have the base vocabulary plus the three reward tokens, as a VideoReward
checkpoint has. The same seed gives the same weights, bit for bit; both library lines.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from fastvideo.tools.tiny_builder import new_folder, run_builder_cli
from fastvideo.utils import atomic_write_json

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen/Qwen2-VL-2B-Instruct's chat template (chat_template.json).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}")
# Qwen/Qwen2-VL-2B-Instruct's preprocessor_config.json.
IMAGE_PROCESSOR = {
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
}
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=1000000.0, use_cache=False)
MROPE = [2, 3, 3]  # sums to half the head width 16, as the 2B's 16 + 24 + 24 = 64
VISION = dict(depth=1, embed_dim=16, hidden_size=32, mlp_ratio=2, num_heads=2, in_chans=3, patch_size=14,
              spatial_merge_size=2, temporal_patch_size=2)
DATA_CONFIG = {"meta_data": "", "data_dir": "", "max_frame_pixels": 240 * 320, "num_frames": None, "fps": 2.0,
               "eval_dim": ["VQ", "MQ", "TA"], "prompt_template_type": "detailed_special", "sample_type": "uniform"}
INFERENCE_CONFIG = {"VQ_mean": 0.25, "VQ_std": 1.5, "MQ_mean": -0.5, "MQ_std": 0.75, "TA_mean": 1.0, "TA_std": 2.0}
LORA = {"lora_enable": True, "lora_r": 2, "lora_alpha": 8, "use_rslora": False}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_tokenizer(out: Path):
    """A byte-level BPE tokenizer in Qwen2's class (one token per byte; merges that make each word of
    VideoAlign's prompt template one token, as the real Qwen2 tokenizer nearly does, then a space
    before a letter and letter pairs) with Qwen2-VL's special tokens, vision tokens and chat template,
    built from vocab.json + merges.txt (both library lines read that form)."""
    from transformers import Qwen2TokenizerFast

    from fastvideo.rewards.videoalign_inputs import DETAILED_SPECIAL
    from fastvideo.tools.make_tiny_flux2 import word_merges
    from fastvideo.tools.tiny_builder import bytes_to_unicode

    out.mkdir(parents=True, exist_ok=True)
    symbols = list(bytes_to_unicode().values())
    space, letters = bytes_to_unicode()[ord(" ")], "abcdefghijklmnopqrstuvwxyz"
    words = sorted(set(re.findall(r" ?[A-Za-z]+", DETAILED_SPECIAL)), key=lambda w: (-len(w), w))
    merges = word_merges(words, bytes_to_unicode())
    merges += [m for m in [(space, c) for c in letters] + [(a, b) for a in letters for b in letters] if m not in merges]
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(symbols + ["".join(m) for m in merges])},
                                               ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    tok = Qwen2TokenizerFast.from_pretrained(out, unk_token=None, bos_token=None, pad_token="<|endoftext|>",
                                             eos_token="<|im_end|>", model_max_length=32768)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *VISION_TOKENS]})
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return tok


def write_processor(out: Path, tokenizer) -> None:
    """Qwen2VLProcessor (its image processor, on transformers 5 also its video processor) with the template."""
    import transformers

    image = transformers.Qwen2VLImageProcessor(**IMAGE_PROCESSOR)
    parts = {"image_processor": image, "tokenizer": tokenizer, "chat_template": CHAT_TEMPLATE}
    if hasattr(transformers, "Qwen2VLVideoProcessor"):
        video = {k: v for k, v in IMAGE_PROCESSOR.items() if k not in ("min_pixels", "max_pixels")}
        parts["video_processor"] = transformers.Qwen2VLVideoProcessor(**video)
    transformers.Qwen2VLProcessor(**parts).save_pretrained(out)


def base_model(tokenizer):
    """The tiny Qwen2VLForConditionalGeneration sized for ``tokenizer`` (either library line's config form)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"),
                   tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    bos, eos = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    text = dict(TEXT, vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos)
    from fastvideo.library_lines import is_current

    if is_current():
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": text.pop("rope_theta"), "mrope_section": MROPE}
        config = Qwen2VLConfig(text_config=text, vision_config=VISION, tie_word_embeddings=False, **ids)
    else:
        config = Qwen2VLConfig(**text, rope_scaling={"type": "mrope", "mrope_section": MROPE}, vision_config=VISION,
                               tie_word_embeddings=False, **ids)
    return Qwen2VLForConditionalGeneration(config)


def upstream_name(name: str) -> str:
    """A weight name of the installed Qwen2-VL in transformers 4.45's layout (upstream's checkpoints)."""
    if name.startswith("model.visual."):
        return name[len("model."):]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def randomise(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Weights far from transformers' small init, so the frames and the prompt move every head."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.1 * noise if "norm" in name and name.endswith("weight") else 0.2 * noise)


def write_checkpoint(folder: Path, vlm, head: torch.nn.Linear, generator: torch.Generator, lora: bool) -> None:
    """model.pth (the whole reward model), or a LoRA checkpoint: random rank-2 adapters on the language
    model's attention projections and the head, as upstream's trainer saves them."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {upstream_name(k): v.clone() for k, v in vlm.state_dict().items()} | {"rm_head.weight": head.weight.clone()}
    if not lora:
        torch.save(state, folder / "model.pth")
        return
    adapters = {}
    for name, value in state.items():
        if name.startswith("model.layers.") and name.rsplit(".", 2)[-2] in LORA_TARGETS and name.endswith(".weight"):
            stem = "base_model.model." + name.removesuffix(".weight")
            adapters[f"{stem}.lora_A.weight"] = 0.2 * torch.randn(LORA["lora_r"], value.shape[1], generator=generator)
            adapters[f"{stem}.lora_B.weight"] = 0.2 * torch.randn(value.shape[0], LORA["lora_r"], generator=generator)
    adapters["base_model.model.rm_head.weight"] = state["rm_head.weight"]  # modules_to_save: in the adapter file
    save_file(adapters, folder / "adapter_model.safetensors")
    rest = {"base_model.model.model.embed_tokens.weight": state["model.embed_tokens.weight"]}
    torch.save(rest, folder / "non_lora_state_dict.pth")


def make_tiny_videoalign(out_dir: str | Path, seed: int = 0, lora: bool = False) -> Path:
    out = new_folder(out_dir)
    base = out / "Qwen2-VL-2B-Instruct"
    tokenizer = write_tokenizer(base)
    write_processor(base, tokenizer)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    vlm = base_model(tokenizer)
    randomise(vlm, generator)
    vlm.save_pretrained(base, safe_serialization=True)
    vlm.resize_token_embeddings(len(tokenizer) + 3, mean_resizing=False)  # <|VQ_reward|> <|MQ_reward|> <|TA_reward|>
    with torch.no_grad():  # the new rows trained, as in a released checkpoint
        vlm.get_input_embeddings().weight[-3:] = 0.2 * torch.randn(3, TEXT["hidden_size"], generator=generator)
        vlm.get_output_embeddings().weight[-3:] = 0.2 * torch.randn(3, TEXT["hidden_size"], generator=generator)
    head = torch.nn.Linear(TEXT["hidden_size"], 3, bias=False)
    randomise(head, generator)
    write_checkpoint(out / "checkpoint-1", vlm, head, generator, lora)
    model_config = {"model_name_or_path": "Qwen/Qwen2-VL-2B-Instruct", "output_dim": 3, "use_special_tokens": True,
                    "reward_token": "special"}
    atomic_write_json(out / "model_config.json", {
        "data_config": DATA_CONFIG, "model_config": model_config,
        "peft_lora_config": LORA if lora else {"lora_enable": False}, "inference_config": INFERENCE_CONFIG})
    return out


def main(argv: list[str] | None = None) -> None:
    options = ((("--lora",), {"action": "store_true", "help": "a LoRA checkpoint instead of model.pth"}),)
    run_builder_cli("make_tiny_videoalign", __doc__, lambda a: make_tiny_videoalign(a.out_dir, a.seed, a.lora),
                    lambda a: "tiny VideoAlign" + (" (LoRA)" if a.lora else ""), argv, options)


if __name__ == "__main__":
    main()
