"""Write a complete diffusers-layout Stable Diffusion 3.5 folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_sd3 OUT_DIR [--seed N]

Same structure and config keys as stabilityai/stable-diffusion-3.5-medium: SD3Transformer2DModel
with q/k RMSNorm (qk_norm "rms_norm") and a dual-attention (MMDiT-X) first block, 16 latent
channels in 2x2 patches, CLIP-L and CLIP-G (CLIPTextModelWithProjection) plus T5 text encoders
with their tokenizers and the flow-matching scheduler with shift 3. Two choices differ from
SD3.5-Medium so that the CPU demo's reward can rise (docs/sd3.md, Demo): the transformer is 32 wide
(2 heads of 16, as the tiny FLUX) and the random VAE's latent scaling / shift factors are
FLUX.1's (0.3611 / 0.1159) instead of SD3.5's (1.5305 / 0.0609). ``StableDiffusion3Pipeline.from_pretrained(OUT_DIR)`` loads it. The same seed gives the
same weights, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fastvideo.tools.make_tiny_flux import (
    tiny_clip_config,
    tiny_t5,
    tiny_vae_config,
    write_clip_tokenizer,
    write_t5_tokenizer,
)
from fastvideo.tools.tiny_builder import new_folder, run_builder_cli, save_tiny_folder, wake_zero_projections

# SD3.5-Medium's scheduler and VAE latent statistics (its scheduler_config.json / vae/config.json).
SD3_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.32.0",
    "num_train_timesteps": 1000,
    "shift": 3.0,
}
SD3_VAE_SCALING = 1.5305
SD3_VAE_SHIFT = 0.0609
# The tiny VAE's factors. Its decoder is random, so no latent statistics fix them. With SD3.5's
# (1.5305 / 0.0609) GRPO on JPEG compressibility did not move the demo's images at all (its
# reward fell as much as under random rewards), even the tiny FLUX transformer did not learn through
# this VAE, and Adam on the images' total variation through the sampler itself (exact gradients)
# lowered it by 5 % where it lowers the tiny FLUX's by 60 %; FLUX.1's factors on the same decoder
# config make it learnable (docs/sd3.md, Demo). Decoding still divides by the scaling factor and
# adds the shift, so a dropped or swapped factor still fails the tests.
TINY_VAE_SCALING = 0.3611
TINY_VAE_SHIFT = 0.1159

# Tiny widths: CLIP-L + CLIP-G hidden sizes (= their projections) must fit in T5's width, as
# 768 + 1280 = 2048 <= 4096 do in SD3.
CLIP_L_WIDTH, CLIP_G_WIDTH, T5_WIDTH = 16, 24, 48
HEADS, HEAD_DIM, LAYERS = 2, 16, 2  # width 32, as the tiny FLUX (width 16 learns slower)


def transformer_config() -> dict:
    return {
        "_class_name": "SD3Transformer2DModel",
        "_diffusers_version": "0.32.0",
        "sample_size": 32,
        "patch_size": 2,
        "in_channels": 16,
        "out_channels": 16,
        "num_layers": LAYERS,
        "attention_head_dim": HEAD_DIM,
        "num_attention_heads": HEADS,
        "joint_attention_dim": T5_WIDTH,
        "caption_projection_dim": HEADS * HEAD_DIM,
        "pooled_projection_dim": CLIP_L_WIDTH + CLIP_G_WIDTH,
        "pos_embed_max_size": 32,
        "dual_attention_layers": [0],
        "qk_norm": "rms_norm",
    }


def vae_config() -> dict:
    return tiny_vae_config((8, 8, 8, 8), 4, TINY_VAE_SCALING, TINY_VAE_SHIFT)


def build_modules(clip_vocab: int, t5_vocab: int, seed: int):
    """Every network of the folder, weights drawn from ``seed``: CLIP-L and CLIP-G are
    CLIPTextModelWithProjection, as SD3's."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel.from_config(transformer_config())
    vae = AutoencoderKL.from_config(vae_config())
    clip_l = CLIPTextModelWithProjection(tiny_clip_config(clip_vocab, CLIP_L_WIDTH, 2))
    clip_g = CLIPTextModelWithProjection(tiny_clip_config(clip_vocab, CLIP_G_WIDTH, 2))
    t5 = tiny_t5(t5_vocab, T5_WIDTH, 64, 1)
    wake_zero_projections(transformer, seed + 1)
    return transformer, vae, clip_l, clip_g, t5


def make_tiny_sd3(out_dir: str | Path, seed: int = 0) -> Path:
    out = new_folder(out_dir)
    clip_vocab = write_clip_tokenizer(out / "tokenizer")
    write_clip_tokenizer(out / "tokenizer_2")
    t5_vocab = write_t5_tokenizer(out / "tokenizer_3")
    names = ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")
    modules = dict(zip(names, build_modules(clip_vocab, t5_vocab, seed)))
    tokenizers = {"tokenizer": "CLIPTokenizer", "tokenizer_2": "CLIPTokenizer", "tokenizer_3": "T5TokenizerFast"}
    return save_tiny_folder(out, modules, SD3_SCHEDULER_CONFIG, "StableDiffusion3Pipeline", tokenizers)


def main(argv: list[str] | None = None) -> None:
    run_builder_cli("make_tiny_sd3", __doc__, lambda a: make_tiny_sd3(a.out_dir, a.seed), lambda a: "tiny SD3.5", argv)


if __name__ == "__main__":
    main()
