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

from pathlib import Path

import torch

from fastvideo.tools.make_tiny_flux import FLUX_VAE_SCALING, FLUX_VAE_SHIFT, tiny_vae_config
from fastvideo.tools.make_tiny_flux2 import QWEN_WIDTH, qwen3, write_qwen_tokenizer
from fastvideo.tools.tiny_builder import new_folder, run_builder_cli, save_tiny_folder, wake_zero_projections

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


def make_tiny_zimage(out_dir: str | Path, seed: int = 0) -> Path:
    out = new_folder(out_dir, "the tiny Z-Image builder")
    vocab = write_qwen_tokenizer(out / "tokenizer")
    modules = dict(zip(("transformer", "vae", "text_encoder"), build_modules(vocab, seed)))
    return save_tiny_folder(out, modules, ZIMAGE_SCHEDULER_CONFIG, "ZImagePipeline", {"tokenizer": "Qwen2TokenizerFast"})


def main(argv: list[str] | None = None) -> None:
    run_builder_cli("make_tiny_zimage", __doc__, lambda a: make_tiny_zimage(a.out_dir, a.seed),
                    lambda a: "tiny Z-Image", argv)


if __name__ == "__main__":
    main()
