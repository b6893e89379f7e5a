"""Write a complete diffusers-layout Stable Diffusion 3.5 folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_sd3 OUT_DIR [--seed N]

Same structure and config keys as stabilityai/stable-diffusion-3.5-medium: SD3Transformer2DModel
with q/k RMSNorm (qk_norm "rms_norm") and a dual-attention (MMDiT-X) first block, 16 latent
channels in 2x2 patches, CLIP-L and CLIP-G (CLIPTextModelWithProjection) plus T5 text encoders
with their tokenizers, the VAE's SD3 shift/scale factors and the flow-matching scheduler with
shift 3. ``StableDiffusion3Pipeline.from_pretrained(OUT_DIR)`` loads it. The same seed gives the
same weights, bit for bit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fastvideo.tools.make_tiny_flux import write_clip_tokenizer, write_t5_tokenizer
from fastvideo.utils import atomic_write_json

# SD3.5-Medium's scheduler and VAE latent statistics (its scheduler_config.json / vae/config.json).
SD3_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.32.0",
    "num_train_timesteps": 1000,
    "shift": 3.0,
}
SD3_VAE_SCALING = 1.5305
SD3_VAE_SHIFT = 0.0609

# Tiny widths: CLIP-L + CLIP-G hidden sizes (= their projections) must fit in T5's width, as
# 768 + 1280 = 2048 <= 4096 do in SD3.
CLIP_L_WIDTH, CLIP_G_WIDTH, T5_WIDTH = 16, 24, 48
HEADS, HEAD_DIM, LAYERS = 2, 8, 2


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
    return {
        "_class_name": "AutoencoderKL",
        "_diffusers_version": "0.32.0",
        "act_fn": "silu",
        "block_out_channels": [8, 8, 8, 8],
        "down_block_types": ["DownEncoderBlock2D"] * 4,
        "up_block_types": ["UpDecoderBlock2D"] * 4,
        "force_upcast": True,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 16,
        "latents_mean": None,
        "latents_std": None,
        "layers_per_block": 1,
        "mid_block_add_attention": True,
        "norm_num_groups": 4,
        "sample_size": 1024,
        "scaling_factor": SD3_VAE_SCALING,
        "shift_factor": SD3_VAE_SHIFT,
        "use_post_quant_conv": False,
        "use_quant_conv": False,
    }


def _clip(vocab: int, width: int):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    return CLIPTextModelWithProjection(CLIPTextConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=77, projection_dim=width,
        bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1,
    ))


def build_modules(clip_vocab: int, t5_vocab: int, seed: int):
    """Every network of the folder, weights drawn from ``seed``."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel.from_config(transformer_config())
    vae = AutoencoderKL.from_config(vae_config())
    clip_l, clip_g = _clip(clip_vocab, CLIP_L_WIDTH), _clip(clip_vocab, CLIP_G_WIDTH)
    t5 = T5EncoderModel(T5Config(
        vocab_size=t5_vocab, d_model=T5_WIDTH, d_kv=T5_WIDTH // 4, d_ff=64, num_layers=1, num_heads=4,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False, pad_token_id=0, eos_token_id=1,
    ))
    # Random init leaves the output projections at zero (adaLN-zero); small values give the tiny
    # model a velocity that depends on its input (the RL needs a signal).
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if torch.count_nonzero(param) == 0 and param.ndim >= 1 and "norm" not in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.02)
    return transformer, vae, clip_l, clip_g, t5


MODEL_INDEX = {
    "_class_name": "StableDiffusion3Pipeline",
    "_diffusers_version": "0.32.0",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
    "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
    "text_encoder_3": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "CLIPTokenizer"],
    "tokenizer_3": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "SD3Transformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}


def make_tiny_sd3(out_dir: str | Path, seed: int = 0) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clip_vocab = write_clip_tokenizer(out / "tokenizer")
    write_clip_tokenizer(out / "tokenizer_2")
    t5_vocab = write_t5_tokenizer(out / "tokenizer_3")
    modules = build_modules(clip_vocab, t5_vocab, seed)
    for name, module in zip(("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"), modules):
        module.save_pretrained(out / name, safe_serialization=True)
    atomic_write_json(out / "scheduler" / "scheduler_config.json", SD3_SCHEDULER_CONFIG)
    atomic_write_json(out / "model_index.json", MODEL_INDEX)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", help="folder to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = make_tiny_sd3(args.out_dir, args.seed)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote tiny SD3.5 folder to {out} ({size / 1e6:.2f} MB, seed {args.seed})")


if __name__ == "__main__":
    main()
