"""Full-size FLUX.1-dev transformer on one accelerator: time per rollout step and per update step,
and the FLOP utilisation they imply.

    python bench/gpu_flux_full.py [--batch-sizes 1 2] [--height 720 --width 720 --text-tokens 512]
                                  [--rollout-steps 5 --update-steps 3 --warmup 2]
                                  [--optimizer none|sgd] [--peak_tflops P]
    python bench/gpu_flux_full.py --allow_cpu      # smoke test: tiny config, 64x64, on CPU

No download: the transformer is built from FLUX.1-dev's config with random weights (on the meta
device, then materialised on the accelerator in bf16 and filled with small random values), 23.8 GB.
Rollout steps are no-grad bf16-autocast forwards; update steps are forward + backward with
gradient checkpointing (what the trainer does), on a stand-in loss (mean square of the velocity:
the GRPO loss is element-wise on the velocity, so the transformer's work is the same).

Why no AdamW: the real run keeps fp32 master weights + two fp32 Adam moments + fp32 grads
(16 bytes x 11.9 B params = 190 GB), sharded over 16 devices by FSDP. One device cannot hold that,
so here the weights and gradients are bf16 and the step is either none (default) or plain SGD in
place (--optimizer sgd; no optimizer state). Optimizer FLOPs are negligible either way.

Utilisation = analytic FLOPs (fastvideo.perf.flops) / measured time / peak. The peak comes from
--peak_tflops, else from the device name (H100/H800/H200 989, A100 312, ...); unknown devices get
times and achieved TFLOPS only. Devices only through fastvideo.devices (CUDA or Ascend NPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from fastvideo import devices  # noqa: E402
from fastvideo.models import flux  # noqa: E402
from fastvideo.perf import flops as F  # noqa: E402
from fastvideo.models.flux import flops as FX  # noqa: E402
from fastvideo.models.flux import predict_velocity  # noqa: E402

BUDGET_S = 420.0  # stop adding batch sizes past this (the whole run must stay under 8 minutes)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=["flux-dev", "small", "tiny"], default=None,
                    help="transformer size (default flux-dev; tiny with --allow_cpu on CPU)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--height", type=int, default=None, help="default 720 (64 for the CPU smoke test)")
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--text-tokens", type=int, default=None, help="default 512 (32 for the CPU smoke test)")
    ap.add_argument("--rollout-steps", type=int, default=5)
    ap.add_argument("--update-steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps of each kind first")
    ap.add_argument("--optimizer", choices=["none", "sgd"], default="none")
    ap.add_argument("--lr", type=float, default=1e-6, help="SGD step size (--optimizer sgd)")
    ap.add_argument("--peak_tflops", type=float, default=None, help="dense bf16 peak of this device, TFLOPS")
    ap.add_argument("--allow_cpu", action="store_true", help="run on CPU (smoke test with the tiny config)")
    args = ap.parse_args(argv)
    return args


def transformer_config(name: str) -> dict:
    if name == "flux-dev":
        cfg = {k: v for k, v in asdict(FX.FLUX_DEV).items() if k != "mlp_ratio"}
        cfg["axes_dims_rope"] = [16, 56, 56]
        return cfg
    from fastvideo.tools.make_tiny_flux import PRESETS
    from fastvideo.tools.make_tiny_flux import transformer_config as preset_config

    return preset_config(PRESETS[name])


def build_transformer(cfg: dict, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Random-weight FluxTransformer2DModel straight on `device` in `dtype` (no fp32 copy first)."""
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        model = FluxTransformer2DModel.from_config(cfg)
    model = model.to(dtype=dtype).to_empty(device=device)
    torch.manual_seed(seed)  # the values only need to be finite and small; timing does not depend on them
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith(".weight"):  # RMSNorm scales
                p.fill_(1.0)
            else:
                p.zero_()
    flux.adapt_for_device(model, device)  # same adaptation load_transformer applies on NPU
    return model


def make_inputs(cfg: dict, batch: int, height: int, width: int, text_tokens: int, device) -> dict:
    lh, lw = flux.latent_hw(height, width)
    g = torch.Generator().manual_seed(1)
    return dict(
        latents=torch.randn(batch, (lh // 2) * (lw // 2), cfg["in_channels"], generator=g).to(device),
        prompt_embeds=torch.randn(batch, text_tokens, cfg["joint_attention_dim"], generator=g).to(device),
        pooled=torch.randn(batch, cfg["pooled_projection_dim"], generator=g).to(device),
        text_ids=flux.text_ids(text_tokens, device=device),
        image_ids=flux.image_ids(lh, lw, device=device),
    )


def timed(fn, device, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        devices.synchronize(device)
        t0 = time.perf_counter()
        fn()
        devices.synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def rollout_step(model, x: dict, device, amp) -> None:
    model.eval()
    with torch.no_grad(), devices.autocast(device, amp, enabled=amp is not None):
        predict_velocity(model, x["latents"], 0.5, x["prompt_embeds"], x["pooled"], x["text_ids"], x["image_ids"])


def update_step(model, x: dict, device, amp, optimizer: str, lr: float) -> None:
    model.train()
    with devices.autocast(device, amp, enabled=amp is not None):
        v = predict_velocity(model, x["latents"], 0.5, x["prompt_embeds"], x["pooled"], x["text_ids"], x["image_ids"])
    v.square().mean().backward()
    if optimizer == "sgd":
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
    model.zero_grad(set_to_none=True)


def fmt_util(flops: float, seconds: float, peak: float | None) -> str:
    achieved = flops / seconds / 1e12
    if peak is None:
        return f"{achieved:8.3g} TFLOPS"
    return f"{achieved:8.3g} TFLOPS {100 * F.utilisation(flops, seconds, 1, peak):5.3g} %"


def bench_batch(model, cfg, b, args, device, amp) -> dict:
    x = make_inputs(cfg, b, args.height, args.width, args.text_tokens, device)
    L, Lt = x["latents"].shape[1], args.text_tokens
    fwd = FX.transformer_forward_flops(cfg, L, Lt, b)
    bwd = FX.transformer_backward_flops(cfg, L, Lt, b)
    rec = FX.transformer_block_flops(cfg, L, Lt, b)
    devices.reset_peak_memory(device)
    timed(lambda: rollout_step(model, x, device, amp), device, args.warmup)
    t_roll = statistics.median(timed(lambda: rollout_step(model, x, device, amp), device, args.rollout_steps))
    timed(lambda: update_step(model, x, device, amp, args.optimizer, args.lr), device, args.warmup)
    t_upd = statistics.median(
        timed(lambda: update_step(model, x, device, amp, args.optimizer, args.lr), device, args.update_steps))
    return dict(batch=b, t_roll=t_roll, t_upd=t_upd, fwd=fwd, bwd=bwd, rec=rec,
                peak_mem_gb=devices.peak_memory_bytes(device) / 1e9)


def report(results: list[dict], peak: float | None) -> None:
    print(f"\n{'B':>3} {'rollout s/step':>15} {'rollout util':>24} {'update s/step':>14} "
          f"{'update MFU (fwd+bwd)':>26} {'update HFU (+recompute)':>26} {'peak mem GB':>12}")
    for r in results:
        print(f"{r['batch']:>3} {r['t_roll']:>15.4f} {fmt_util(r['fwd'], r['t_roll'], peak):>24} {r['t_upd']:>14.4f} "
              f"{fmt_util(r['fwd'] + r['bwd'], r['t_upd'], peak):>26} "
              f"{fmt_util(r['fwd'] + r['bwd'] + r['rec'], r['t_upd'], peak):>26} {r['peak_mem_gb']:>12.1f}")


def estimate_iteration(results: list[dict], config: str) -> None:
    """Compute-only time of one reference iteration per rank (12 samples x 16 rollout steps at the
    best measured rollout batch, 12 x 9 update steps at batch 1); no VAE, reward or communication."""
    best = min(results, key=lambda r: r["t_roll"] / r["batch"])
    one = next((r for r in results if r["batch"] == 1), None)
    if one is None:
        return
    roll = 16 * 12 / best["batch"] * best["t_roll"]
    upd = 9 * 12 * one["t_upd"]
    print(f"\ncompute-only estimate of one reference iteration per rank ({config}; 16 steps x 12 samples rollout at "
          f"batch {best['batch']}, 9 x 12 update steps): rollout {roll:.1f} s + update {upd:.1f} s "
          f"= {roll + upd:.1f} s")
    if config == "flux-dev":
        print("(published whole iterations, FLUX.1-dev 720x720: ~216 s on 16 H800, ~310 s on 16 A3 dies)")


def main(argv=None) -> None:
    args = parse_args(argv)
    device = devices.get_device()
    on_cpu = not devices.is_accelerator(device)
    if on_cpu and not args.allow_cpu:
        raise SystemExit(
            "gpu_flux_full.py needs an accelerator (CUDA GPU or Ascend NPU); none was found. "
            "For a smoke test of the script on CPU pass --allow_cpu (tiny config, 64x64)."
        )
    args.config = args.config or ("tiny" if on_cpu else "flux-dev")
    if on_cpu and args.config == "flux-dev":
        raise SystemExit("--allow_cpu runs the tiny or small config only; FLUX.1-dev size needs an accelerator")
    args.height = args.height or (64 if on_cpu else 720)
    args.width = args.width or (64 if on_cpu else 720)
    args.text_tokens = args.text_tokens or (32 if on_cpu else 512)
    dtype, amp = (torch.float32, None) if on_cpu else (torch.bfloat16, torch.bfloat16)

    name = devices.device_name(device)
    peak = args.peak_tflops or (None if on_cpu else F.peak_tflops_for(name))
    peak_text = f"{peak:g} TFLOPS" if peak else "unknown (pass --peak_tflops for utilisation)"
    print(f"device {device} ({name}); peak {peak_text}; config {args.config}, {args.height}x{args.width}, "
          f"{args.text_tokens} text tokens, "
          f"weights {str(dtype).replace('torch.', '')}, optimizer {args.optimizer}")
    devices.enable_fast_matmul(device)
    t0 = time.perf_counter()
    cfg = transformer_config(args.config)
    model = build_transformer(cfg, device, dtype)
    model.enable_gradient_checkpointing()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"built {n_params / 1e9:.2f} B parameters in {time.perf_counter() - t0:.1f} s")

    results = []
    for b in args.batch_sizes:
        if time.perf_counter() - t0 > BUDGET_S:
            print(f"skipping batch {b}: past the {BUDGET_S:.0f} s budget")
            continue
        r = bench_batch(model, cfg, b, args, device, amp)
        results.append(r)
        print(f"batch {b}: rollout {r['t_roll']:.4f} s/step, update {r['t_upd']:.4f} s/step "
              f"({time.perf_counter() - t0:.0f} s elapsed)", flush=True)
    report(results, peak)
    estimate_iteration(results, args.config)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
