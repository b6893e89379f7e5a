"""Write a complete diffusers-layout Qwen-Image folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_qwen_image OUT_DIR [--seed N]

Same structure and config keys as Qwen/Qwen-Image, scaled down: QwenImageTransformer2DModel (double-
stream MMDiT blocks with q/k RMS norms, 3-axis RoPE with scale_rope, 2x2 patches of 16 channels),
AutoencoderKLQwenImage (the causal 3D video VAE with a frame axis, 8x spatial compression, Qwen-Image's
per-channel latents_mean / latents_std), a Qwen2.5-VL text encoder (Qwen2_5_VLForConditionalGeneration
built from a config: a 2-layer language model with multimodal RoPE and a 1-block vision tower the
text-only prompts never reach), the byte-level BPE tokenizer of the tiny FLUX.2 [klein]
(make_tiny_flux2: nothing from the hub) whose merges make the words of QwenImagePipeline's system
prompt whole tokens, so that its template's prefix is 34 tokens as with the real Qwen2.5 tokenizer
(the pipeline drops exactly 34: prompt_template_encode_start_idx), and Qwen-Image's scheduler
(dynamic exponential shift, base 0.5 / max 0.9 over 256 .. 8192 tokens, shift_terminal 0.02).
QwenImagePipeline loads the folder; the same seed gives the same weights, bit for bit. Needs the
current library line.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from fastvideo.models.qwen_image.components import SCHEDULER_SHIFT_TERMINAL
from fastvideo.tools.make_tiny_flux2 import write_qwen_tokenizer
from fastvideo.tools.tiny_builder import new_folder, run_builder_cli, save_tiny_folder, wake_zero_projections

# Qwen/Qwen-Image's scheduler/scheduler_config.json.
QWEN_IMAGE_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.42.1",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": SCHEDULER_SHIFT_TERMINAL,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}
# QwenImagePipeline's system prompt (diffusers 0.42.1 prompt_template_encode, up to the user's text).
SYSTEM_PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
                 "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
PREFIX_TOKENS = 34  # the pipeline's prompt_template_encode_start_idx: the prefix's length in Qwen2.5's tokens
TEXT_WIDTH, TEXT_LAYERS, TEXT_HEADS = 32, 2, 2  # joint_attention_dim = the encoder's width (3584 for the 7B)
HEADS, HEAD_DIM, LAYERS = 2, 16, 2  # transformer width 32, as the tiny FLUX.1 / Z-Image


def prefix_words() -> list[str]:
    """The system prompt's words as the Qwen2.5 tokenizer splits them (a space stays with the word after it)."""
    text = SYSTEM_PREFIX.replace("<|im_start|>", "\n").replace("<|im_end|>", "\n")
    return sorted(set(re.findall(r" ?[A-Za-z]+", text)), key=lambda w: (len(w), w))


def transformer_config() -> dict:
    return {
        "_class_name": "QwenImageTransformer2DModel", "_diffusers_version": "0.42.1",
        "patch_size": 2, "in_channels": 64, "out_channels": 16,  # 2x2 patches of the VAE's 16 channels
        "num_layers": LAYERS, "attention_head_dim": HEAD_DIM, "num_attention_heads": HEADS,
        "joint_attention_dim": TEXT_WIDTH,
        "guidance_embeds": False,
        "axes_dims_rope": [4, 6, 6],  # sum = the head width 16, as Qwen-Image's 16 + 56 + 56 = 128
    }


def vae_config() -> dict:
    """AutoencoderKLQwenImage 8 wide: three spatial down-samplings (two of them temporal), Qwen-Image's statistics."""
    return {
        "_class_name": "AutoencoderKLQwenImage", "_diffusers_version": "0.42.1",
        "base_dim": 8, "z_dim": 16, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1,
        "attn_scales": [], "temperal_downsample": [False, True, True], "dropout": 0.0,
        "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715,
                         0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
        "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652,
                        1.5579, 1.6382, 1.1253, 2.8251, 1.916],
    }


def qwen2_5_vl(vocab: int, bos: int, eos: int, vision: dict | None = None, token_ids: dict | None = None):
    """Qwen2_5_VLForConditionalGeneration at width 32: grouped-query attention, multimodal RoPE (its
    sections sum to half the head width, as the 7B's 16 + 24 + 24 = 64), a 1-block vision tower
    (``vision``: another vision config; ``token_ids``: the tokenizer's vision token ids, for a
    tokenizer that has them, make_tiny_qwen_image_edit)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(vocab_size=vocab, hidden_size=TEXT_WIDTH, intermediate_size=2 * TEXT_WIDTH,
                num_hidden_layers=TEXT_LAYERS, num_attention_heads=TEXT_HEADS, num_key_value_heads=1,
                max_position_embeddings=4096, use_cache=False, rms_norm_eps=1e-6, bos_token_id=bos, eos_token_id=eos,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                 "mrope_section": [2, 3, 3]})
    vision = vision or dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TEXT_WIDTH,
                            fullatt_block_indexes=[0])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **(token_ids or {}))
    return Qwen2_5_VLForConditionalGeneration(config)


def build_modules(tokenizer, seed: int):
    """Every network of the folder, weights drawn from ``seed``; the text encoder sized for ``tokenizer``."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel.from_config(transformer_config())
    vae = AutoencoderKLQwenImage.from_config(vae_config())
    text_encoder = qwen2_5_vl(len(tokenizer), *tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"]))
    wake_zero_projections(transformer, seed + 1)
    return transformer, vae, text_encoder


def make_tiny_qwen_image(out_dir: str | Path, seed: int = 0) -> Path:
    out = new_folder(out_dir, "the tiny Qwen-Image builder")
    from transformers import Qwen2Tokenizer

    write_qwen_tokenizer(out / "tokenizer", prefix_words())
    tokenizer = Qwen2Tokenizer.from_pretrained(out / "tokenizer")
    modules = dict(zip(("transformer", "vae", "text_encoder"), build_modules(tokenizer, seed)))
    return save_tiny_folder(out, modules, QWEN_IMAGE_SCHEDULER_CONFIG, "QwenImagePipeline",
                            {"tokenizer": "Qwen2Tokenizer"})


def main(argv: list[str] | None = None) -> None:
    run_builder_cli("make_tiny_qwen_image", __doc__, lambda a: make_tiny_qwen_image(a.out_dir, a.seed),
                    lambda a: "tiny Qwen-Image", argv)


if __name__ == "__main__":
    main()
