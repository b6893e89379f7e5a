"""Write a complete diffusers-layout Z-Image folder with random weights, built offline.

    python -m fastvideo.tools.make_tiny_zimage OUT_DIR [--seed N]

Same structure and config keys as Tongyi-MAI/Z-Image, scaled down: ZImageTransformer2DModel with
noise- and context-refiner blocks and the main single-stream blocks (q/k RMS norms, SwiGLU, adaLN
modulation, 3-axis complex RoPE, 2x2 patches of 16 channels), FLUX.1's 16-channel AutoencoderKL
with its latent scaling / shift factors, a Qwen3 text encoder (the pipeline reads its
second-to-last hidden layer) with the byte-level BPE tokenizer and Qwen3-style chat template of
the tiny FLUX.2 [klein] (make_tiny_flux2: nothing from the hub), and Z-Image's flow-matching
scheduler (shift 3, no dynamic shifting). ZImagePipeline loads the folder; the same seed gives the
same weights, bit for bit. Needs the current library line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fastvideo.tools.make_tiny_flux import (
    FLUX_VAE_SCALING,
    FLUX_VAE_SHIFT,
    folder_megabytes,
    save_tiny_folder,
    tiny_vae_config,
    wake_zero_projections,
)
from fastvideo.tools.make_tiny_flux2 import QWEN_WIDTH, qwen3, write_qwen_tokenizer

# Z-Image's (and Z-Image-Turbo's) scheduler: a static shift of 3, no dynamic shifting (the pipeline
# computes a mu the scheduler then ignores).
ZIMAGE_SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.42.1",
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}
QWEN_LAYERS = 4  # the pipeline reads hidden_states[-2]: the third layer's output here
DIM, HEADS, LAYERS, REFINERS = 32, 2, 2, 1  # transformer width 32, as the tiny FLUX.1 / klein


def transformer_config() -> dict:
    return {
        "_class_name": "ZImageTransformer2DModel",
        "_diffusers_version": "0.42.1",
        "all_patch_size": [2],
        "all_f_patch_size": [1],
        "in_channels": 16,
        "dim": DIM,
        "n_layers": LAYERS,
        "n_refiner_layers": REFINERS,
        "n_heads": HEADS,
        "n_kv_heads": HEADS,
        "norm_eps": 1e-5,
        "qk_norm": True,
        "cap_feat_dim": QWEN_WIDTH,
        "rope_theta": 256.0,
        "t_scale": 1000.0,
        "axes_dims": [4, 6, 6],  # sum = the head width 16, as Z-Image's 32 + 48 + 48 = 128
        "axes_lens": [1536, 512, 512],
    }


def build_modules(vocab: int, seed: int):
    """Every network of the folder, weights drawn from ``seed``."""
    from diffusers import AutoencoderKL, ZImageTransformer2DModel

    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel.from_config(transformer_config())
    vae = AutoencoderKL.from_config(tiny_vae_config((8, 8, 8, 8), 4, FLUX_VAE_SCALING, FLUX_VAE_SHIFT))
    text_encoder = qwen3(vocab, QWEN_LAYERS)
    with torch.no_grad():  # the pad tokens start at zero; a trained model's are not
        for token in (transformer.x_pad_token, transformer.cap_pad_token):
            token.normal_(0.0, 0.5)
    wake_zero_projections(transformer, seed + 1)
    return transformer, vae, text_encoder


MODEL_INDEX = {
    "_class_name": "ZImagePipeline",
    "_diffusers_version": "0.42.1",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "Qwen3ForCausalLM"],
    "tokenizer": ["transformers", "Qwen2TokenizerFast"],
    "transformer": ["diffusers", "ZImageTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}


def make_tiny_zimage(out_dir: str | Path, seed: int = 0) -> Path:
    from fastvideo.library_lines import CURRENT, require_line

    require_line(CURRENT, "the tiny Z-Image builder")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_qwen_tokenizer(out / "tokenizer")
    modules = build_modules(vocab, seed)
    names = ("transformer", "vae", "text_encoder")
    return save_tiny_folder(out, dict(zip(names, modules)), ZIMAGE_SCHEDULER_CONFIG, MODEL_INDEX)


def main(argv: list[str] | None = None) -> None:
    from fastvideo.errors import UserError, exit_on_user_error

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", help="folder to write (created if missing)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        out = make_tiny_zimage(args.out_dir, args.seed)
    except UserError as exc:  # the recipe line: one line naming the line to install, exit 2
        exit_on_user_error("make_tiny_zimage", exc)
    print(f"wrote tiny Z-Image folder to {out} ({folder_megabytes(out):.2f} MB, seed {args.seed})")


if __name__ == "__main__":
    main()
