"""FSDP throughput options on 2 gloo ranks: bf16 parameter gathers over fp32 master shards
(--fsdp_param_dtype bf16), forward prefetch (--fsdp_forward_prefetch)."""

from __future__ import annotations

import torch
from dist_utils import run_distributed, tiny_inputs, tiny_transformer

from fastvideo.distributed import fsdp


def _bf16_gather_and_prefetch(info):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    ref = tiny_transformer()
    with torch.autocast("cpu", torch.bfloat16):
        want = ref(**tiny_inputs(info.rank))[0].float()
    policy = fsdp.PrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_inputs=False)
    model = fsdp.wrap_model(tiny_transformer(), "full", info.device, mixed_precision=policy, forward_prefetch=True)
    units = FSDP.fsdp_modules(model)
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


def test_bf16_gathers_keep_fp32_masters_and_prefetch():
    for r in run_distributed(_bf16_gather_and_prefetch, world_size=2):
        assert r["prefetch"]
        assert r["gathered"] == "torch.bfloat16"  # the block computes with the bf16 gather
        assert r["inputs"] == "torch.float32"  # the root's inputs left to autocast (cast_inputs=False)
        assert r["masters"] == ["torch.float32"] and r["grads"] == ["torch.float32"]
        # the same bf16 autocast compute on the unwrapped fp32 model: only the weights' rounding differs
        assert r["err"] <= 0.05 * r["scale"], r
