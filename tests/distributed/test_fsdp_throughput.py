"""FSDP throughput options on 2 gloo ranks: bf16 parameter gathers over fp32 master shards
(--fsdp_param_dtype bf16), forward prefetch (--fsdp_forward_prefetch)."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed, tiny_inputs, tiny_transformer

from fastvideo.distributed import fsdp


def _bf16_gather_and_prefetch(info, version=1):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    ref = tiny_transformer()
    with torch.autocast("cpu", torch.bfloat16):
        want = ref(**tiny_inputs(info.rank))[0].float()
    policy = fsdp.PrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_inputs=False)
    model = fsdp.wrap_model(tiny_transformer(), "full", info.device, mixed_precision=policy, forward_prefetch=True,
                            version=version)
    units = FSDP.fsdp_modules(model) if version == 1 else []  # FSDP2's prefetch: tests/distributed/test_fsdp2.py
    seen = {}
    to_q = fsdp.unwrap_model(model).transformer_blocks[0].attn.to_q  # inside the block's unit
    to_q.register_forward_pre_hook(lambda m, args: seen.update(weight=m.weight.dtype))
    fsdp.unwrap_model(model).x_embedder.register_forward_pre_hook(lambda m, args: seen.update(hidden=args[0].dtype))
    with torch.autocast("cpu", torch.bfloat16):
        out = model(**tiny_inputs(info.rank))[0].float()
    out.square().mean().backward()
    return {"prefetch": all(u.forward_prefetch for u in units), "gathered": str(seen["weight"]),
            "inputs": str(seen["hidden"]),
            "masters": sorted({str(p.dtype) for p in model.parameters()}),
            "grads": sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None}),
            "err": float((out - want).abs().max()), "scale": float(want.abs().max())}


@pytest.mark.parametrize("version", [1, 2])
def test_bf16_gathers_keep_fp32_masters_and_prefetch(version):
    """FSDP1 and FSDP2 (MixedPrecisionPolicy) alike."""
    for r in run_distributed(_bf16_gather_and_prefetch, version, world_size=2):
        assert r["prefetch"]
        assert r["gathered"] == "torch.bfloat16"  # the block computes with the bf16 gather
        assert r["inputs"] == "torch.float32"  # the root's inputs left to autocast (cast_inputs=False)
        assert r["masters"] == ["torch.float32"] and r["grads"] == ["torch.float32"]
        # the same bf16 autocast compute on the unwrapped fp32 model: only the weights' rounding differs
        assert r["err"] <= 0.05 * r["scale"], r


def _gathers_per_rollout(info):
    """All-gathers of 3 no-grad forwards and one trained forward + backward, per strategy."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from dist_utils import loss_fn

    out = {}
    real = dist.all_gather  # FSDP1's gather of CPU shards (all_gather_into_tensor on a device)
    for strategy in ("full", "zero2"):
        model = fsdp.wrap_model(tiny_transformer(), strategy, info.device)
        calls = []

        def counting(*args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs)

        dist.all_gather = counting
        try:
            with torch.no_grad():
                for step in range(3):
                    model(**tiny_inputs(info.rank + step))
            rollout = len(calls)
            loss_fn(model, tiny_inputs(info.rank)).backward()
        finally:
            dist.all_gather = real
        out[strategy] = {"units": len(FSDP.fsdp_modules(model)), "rollout": rollout, "update": len(calls) - rollout,
                         "strategy": str(model.sharding_strategy)}
    return out


def test_zero2_gathers_once_per_rollout():
    for r in run_distributed(_gathers_per_rollout, world_size=2):
        full, zero2 = r["full"], r["zero2"]
        assert zero2["strategy"].endswith("SHARD_GRAD_OP") and full["strategy"].endswith("FULL_SHARD")
        units = full["units"]  # root + 2 blocks
        assert units == zero2["units"] == 3
        # full shard: every forward gathers every block unit (the root stays gathered after a
        # forward in FSDP1): 3 + 2 + 2
        assert full["rollout"] == units + 2 * (units - 1), r
        assert zero2["rollout"] == units, r  # the first forward gathers; the next two reuse it
        assert zero2["update"] == 0, r  # the trained forward and its backward still hold the gather
        assert full["update"] >= units - 1, r  # the full shard gathers the blocks again


def _lora_layout(info, model_dir):
    from pathlib import Path

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from fastvideo.models import flux
    from fastvideo.training.lora import LoraSettings, apply_lora

    def lora_model():
        model = flux.load_transformer(Path(model_dir), device=info.device, dtype=torch.float32)
        apply_lora(model, LoraSettings(True, 4, 8.0, 0.0, ("to_k", "to_q", "to_v", "to_out.0"), None),
                   torch.bfloat16, torch.float32, seed=0)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():  # non-zero B, so the adapters change the output
            for name, p in sorted(model.named_parameters()):
                if ".lora_B." in name:
                    p.copy_(0.01 * torch.randn(p.shape, generator=g))
        return model

    ref = lora_model()
    n_blocks = len(ref.transformer_blocks) + len(ref.single_transformer_blocks)
    adapters = sorted(n for n, p in ref.named_parameters() if p.requires_grad)
    inputs = {k: (v.to(torch.bfloat16) if k in ("hidden_states", "encoder_hidden_states", "pooled_projections")
                  else v) for k, v in tiny_inputs(info.rank).items()}
    with torch.autocast("cpu", torch.bfloat16):
        want = ref(**inputs)[0].float()
    model = fsdp.wrap_model(lora_model(), "full", info.device, replicate_frozen=True,
                            block_classes=flux.FluxFamily().block_classes())
    units = FSDP.fsdp_modules(model)
    flats = [u._handle.flat_param for u in units if u._handle is not None]
    with torch.autocast("cpu", torch.bfloat16):
        out = model(**inputs)[0].float()
    out.square().mean().backward()
    saved = fsdp.full_model_state_dict(model, trainable_only=True)
    fsdp2_layout = _fsdp2_lora_layout(lora_model, info.device, flux.FluxFamily().block_classes())
    return {**fsdp2_layout, "units": len(units), "blocks": n_blocks, "adapter_linears": len(adapters) // 2,
            "flat": sorted({(f.requires_grad, str(f.dtype)) for f in flats}),
            "grads": all(f.grad is not None for f in flats),
            "err": float((out - want).abs().max()), "scale": float(want.abs().max()),
            "saved": sorted(saved) == adapters if info.rank == 0 else True}


def _fsdp2_lora_layout(lora_model, device, block_classes) -> dict:
    """FSDP2 under LoRA: with replicate_frozen the frozen base stays plain tensors (ignored_params)
    and only the adapters are DTensors; with extra_units (the CPU-offload layout) every adapter
    Linear is its own fully_shard unit."""
    from torch.distributed.tensor import DTensor

    from fastvideo.distributed.fsdp2 import fsdp2_modules
    from fastvideo.training.lora import is_adapter_unit

    two = fsdp.wrap_model(lora_model(), "full", device, replicate_frozen=True, block_classes=block_classes, version=2)
    split = fsdp.wrap_model(lora_model(), "full", device, extra_units=is_adapter_unit, block_classes=block_classes,
                            version=2)
    return {"v2_frozen_dtensors": sum(isinstance(p, DTensor) for p in two.parameters() if not p.requires_grad),
            "v2_trainable_dtensors": all(isinstance(p, DTensor) for p in two.parameters() if p.requires_grad),
            "v2_adapter_units": sum(is_adapter_unit(m) for m in fsdp2_modules(split)),
            "v2_adapters": sum(is_adapter_unit(m) for m in split.modules())}


def test_lora_has_one_fsdp_unit_per_block(tiny_flux_dir):
    """Under LoRA the wrapped tiny FLUX has at most one FSDP unit per block (+ root): each block's
    unit holds its adapters, the frozen base is replicated outside FSDP. FSDP2 likewise keeps the
    base out of its DTensors, and with extra_units makes every adapter Linear a unit."""
    for r in run_distributed(_lora_layout, str(tiny_flux_dir), world_size=2):
        assert r["units"] <= r["blocks"] + 1 < r["adapter_linears"], r
        assert r["flat"] == [(True, "torch.float32")] and r["grads"]
        assert r["saved"]  # the adapters, by their unwrapped names
        assert r["err"] <= 1e-5 * max(1.0, r["scale"]), r  # the same computation as unwrapped
        assert r["v2_frozen_dtensors"] == 0 and r["v2_trainable_dtensors"], r  # FSDP2: the base replicated
        assert r["v2_adapter_units"] == r["v2_adapters"] == r["adapter_linears"] * 2, r  # each A and B a unit
