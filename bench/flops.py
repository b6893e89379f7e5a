"""Analytic FLOPs (fastvideo.perf.flops) against torch's FlopCounterMode, table with ratios.

    python bench/flops.py [--presets tiny small] [--sizes 64 128] [--text-tokens 32 64] [--flux-dev]

For each preset, image size and text length: one transformer forward, forward + backward, and
forward + backward with gradient checkpointing (all counted on CPU with random weights), and one
VAE decode. --flux-dev adds FLUX.1-dev at 720x720 with 512 text tokens, built on the meta device
(no memory, no weights, a few seconds). Attention runs on the math SDPA backend while counting so
that FlopCounterMode sees its matmuls on every device.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from fastvideo.perf import flops as F  # noqa: E402
from fastvideo.models.flux import flops as FX  # noqa: E402


def transformer_inputs(cfg: dict, image_tokens: int, text_tokens: int, batch: int, device="cpu") -> dict:
    g = torch.Generator().manual_seed(0)
    mk = (lambda *s: torch.randn(*s, generator=g)) if device == "cpu" else (lambda *s: torch.empty(*s, device=device))
    return dict(
        hidden_states=mk(batch, image_tokens, cfg.get("in_channels", 64)),
        encoder_hidden_states=mk(batch, text_tokens, cfg["joint_attention_dim"]),
        pooled_projections=mk(batch, cfg["pooled_projection_dim"]),
        timestep=torch.full((batch,), 0.5, device=device),
        guidance=torch.full((batch,), 3.5, device=device),
        img_ids=torch.zeros(image_tokens, 3, device=device),
        txt_ids=torch.zeros(text_tokens, 3, device=device),
        return_dict=False,
    )


def counted_transformer(model, kw: dict) -> dict[str, int]:
    """Counted FLOPs of a forward, a forward + backward, and the same with checkpointing."""
    model.eval()
    with torch.no_grad():
        fwd = F.count_flops(lambda: model(**kw))
    model.train()
    model.disable_gradient_checkpointing()
    fb = F.count_flops(lambda: model(**kw)[0].float().square().mean().backward())
    model.enable_gradient_checkpointing()
    ck = F.count_flops(lambda: model(**kw)[0].float().square().mean().backward())
    model.disable_gradient_checkpointing()
    model.zero_grad(set_to_none=True)
    return {"forward": fwd, "fwd+bwd": fb, "fwd+bwd ckpt": ck}


def analytic_transformer(cfg: dict, L: int, Lt: int, B: int) -> dict[str, int]:
    fwd = FX.transformer_forward_flops(cfg, L, Lt, B)
    bwd = FX.transformer_backward_flops(cfg, L, Lt, B)
    return {"forward": fwd, "fwd+bwd": fwd + bwd, "fwd+bwd ckpt": fwd + bwd + FX.transformer_block_flops(cfg, L, Lt, B)}


def rows_for_preset(name: str, sizes, text_tokens, batch: int) -> list[tuple]:
    from diffusers import AutoencoderKL, FluxTransformer2DModel

    from fastvideo.tools.make_tiny_flux import PRESETS, transformer_config, vae_config

    tcfg, vcfg = transformer_config(PRESETS[name]), vae_config(PRESETS[name])
    torch.manual_seed(0)
    model = FluxTransformer2DModel.from_config(tcfg)
    vae = AutoencoderKL.from_config(vcfg).eval()
    rows = []
    for size, lt in zip(sizes, text_tokens):
        L = F.image_tokens_for(size, size)
        counted = counted_transformer(model, transformer_inputs(tcfg, L, lt, batch))
        analytic = analytic_transformer(tcfg, L, lt, batch)
        for what in counted:
            rows.append((name, f"{size}x{size}", lt, batch, what, analytic[what], counted[what]))
        with torch.no_grad():
            vc = F.count_flops(lambda: vae.decode(torch.randn(1, 16, size // 8, size // 8)))
        rows.append((name, f"{size}x{size}", "-", 1, "VAE decode", F.vae_decoder_flops(vcfg, size // 8, size // 8), vc))
    return rows


def rows_for_flux_dev() -> list[tuple]:
    """FLUX.1-dev transformer (forward) and VAE decode at 720x720, on the meta device."""
    from dataclasses import asdict

    from diffusers import AutoencoderKL, FluxTransformer2DModel

    tcfg = {k: v for k, v in asdict(FX.FLUX_DEV).items() if k != "mlp_ratio"}
    vcfg = dict(FX.FLUX_DEV_VAE_CONFIG, in_channels=3, norm_num_groups=32, act_fn="silu", use_quant_conv=False,
                down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4)
    L, Lt = F.image_tokens_for(720, 720), 512
    with torch.device("meta"):
        model = FluxTransformer2DModel.from_config(tcfg).eval()
        vae = AutoencoderKL.from_config(vcfg).eval()
        kw = transformer_inputs(tcfg, L, Lt, 1, device="meta")
        with torch.no_grad():
            fwd = F.count_flops(lambda: model(**kw))
            vc = F.count_flops(lambda: vae.decode(torch.empty(1, 16, 90, 90)))
    return [
        ("flux-dev", "720x720", Lt, 1, "forward", FX.transformer_forward_flops(FX.FLUX_DEV, L, Lt), fwd),
        ("flux-dev", "720x720", "-", 1, "VAE decode", F.vae_decoder_flops(None, 90, 90), vc),
    ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[64, 128], help="square image sizes (multiples of 16)")
    ap.add_argument("--text-tokens", nargs="+", type=int, default=[32, 64], help="one per size")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--flux-dev", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args(argv)
    if len(args.text_tokens) != len(args.sizes):
        ap.error("give one --text-tokens value per --sizes value")
    t0 = time.perf_counter()
    rows = []
    for name in args.presets:
        rows += rows_for_preset(name, args.sizes, args.text_tokens, args.batch)
    if args.flux_dev:
        rows += rows_for_flux_dev()
    print(f"{'model':<9}{'image':>9}{'text':>6}{'B':>3}  {'what':<14}{'analytic':>14}{'counted':>14}{'ratio':>9}")
    for name, img, lt, b, what, a, c in rows:
        ratio = a / c if c else float("nan")
        print(f"{name:<9}{img:>9}{lt!s:>6}{b:>3}  {what:<14}{a:>14.4e}{c:>14.4e}{ratio:>9.5f}")
    print(f"({time.perf_counter() - t0:.1f} s; counted = torch.utils.flop_counter.FlopCounterMode)")


if __name__ == "__main__":
    main()
