"""The diffusers 0.32.0 series (patches/diffusers-0.32.0), checked against stock diffusers 0.32.0.

Usage and modes: see common.py. Without torch_npu the patched package must compute exactly what
the stock release computes; with the stand-in torch_npu it must take the fused kernels and agree
within the kernels' precision.
"""

from __future__ import annotations

import sys

import torch

from common import TINY, check, flux_ids, flux_inputs, joint_attention_inputs, parse_args, randomise_norm_weights

VERSION = "0.32.0"
QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")


@torch.no_grad()
def reference() -> dict:
    """Outputs of the installed (stock) diffusers 0.32.0 on fixed inputs."""
    import diffusers
    from diffusers import FluxTransformer2DModel
    from diffusers.models.attention_processor import FluxAttnProcessor2_0
    from diffusers.models.embeddings import FluxPosEmbed
    from diffusers.models.normalization import RMSNorm

    assert diffusers.__version__ == VERSION, diffusers.__version__
    torch.manual_seed(0)
    norms = []
    for affine, x_dtype in [(True, torch.float32), (True, torch.bfloat16), (False, torch.float32)]:
        norm = RMSNorm(16, eps=1e-6, elementwise_affine=affine)
        if affine:
            norm.weight.uniform_(0.5, 1.5)
        x = (torch.randn(2, 2, 7, 16) * 3).to(x_dtype)
        norms.append({"affine": affine, "state": norm.state_dict(), "x": x, "y": norm(x)})
    ids = flux_ids()
    cos, sin = FluxPosEmbed(10000, [16, 56, 56])(ids)

    model = FluxTransformer2DModel(**TINY).eval()
    randomise_norm_weights(model)
    inputs = flux_inputs()
    out = model(**inputs).sample
    # One joint FLUX attention in bf16 autocast with fp32 weights: q/k fp32, v bf16.
    attn = model.transformer_blocks[0].attn
    assert isinstance(attn.processor, FluxAttnProcessor2_0)
    attn_in = joint_attention_inputs(model, inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn_out = attn(**attn_in)
    return {
        "norms": norms, "ids": ids, "cos": cos, "sin": sin, "state": model.state_dict(),
        "inputs": inputs, "out": out, "attn_in": attn_in, "attn_out": list(attn_out),
    }


def _imports(mode: str, src: str):
    import diffusers
    from diffusers.models import attention_processor, normalization

    assert diffusers.__file__.startswith(src), diffusers.__file__
    if mode == "stub":
        import torch_npu

        assert normalization.torch_npu is torch_npu and attention_processor.torch_npu is torch_npu
        normalization.is_npu_tensor = lambda tensor: True  # CPU tensors stand in for NPU ones
        return torch_npu
    assert normalization.torch_npu is None and attention_processor.torch_npu is None
    assert "torch_npu" not in sys.modules
    # "broken": torch_npu installed (metadata present) but failing on import, as without CANN;
    # it must count as unavailable, so nothing imports it and FLUX keeps the plain processor.
    assert not diffusers.utils.is_torch_npu_available()
    return None


@torch.no_grad()
def patched(mode: str, ref: dict, src: str) -> None:
    from diffusers import FluxTransformer2DModel
    from diffusers.models import attention_processor
    from diffusers.models.embeddings import FluxPosEmbed
    from diffusers.models.normalization import NpuFusedRMSNorm, RMSNorm

    torch_npu = _imports(mode, src)
    stub = torch_npu is not None
    for i, case in enumerate(ref["norms"]):
        norm = NpuFusedRMSNorm(16, eps=1e-6, elementwise_affine=case["affine"])
        norm.load_state_dict(case["state"])
        atol = 0 if not stub else (1e-6 if case["x"].dtype == torch.float32 else 1e-2)
        check(mode, f"rms_norm[{i}]", norm(case["x"]), case["y"], atol)

    cos, sin = FluxPosEmbed(10000, [16, 56, 56])(ref["ids"])
    check(mode, "flux_pos_embed.cos", cos, ref["cos"], 0)
    check(mode, "flux_pos_embed.sin", sin, ref["sin"], 0)

    model = FluxTransformer2DModel(**TINY).eval()
    model.load_state_dict(ref["state"], strict=True)  # same state-dict keys
    attn = model.transformer_blocks[0].attn
    assert all(isinstance(getattr(attn, n), NpuFusedRMSNorm) for n in QK_NORMS)
    assert isinstance(attn.norm_q, RMSNorm)
    if not stub:
        single = model.single_transformer_blocks[0].attn.processor
        assert type(single) is attention_processor.FluxAttnProcessor2_0, single
    check(mode, "flux_transformer", model(**ref["inputs"]).sample, ref["out"], 1e-6 if stub else 0)
    if stub:
        assert torch_npu.calls["npu_rms_norm"] == 6 + 3, dict(torch_npu.calls)

    # diffusers' own NPU processor on the same attention, bf16 autocast (q/k fp32, v bf16)
    attn.set_processor(attention_processor.FluxAttnProcessor2_0_NPU())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(**ref["attn_in"])
    for j, (got, want) in enumerate(zip(out, ref["attn_out"])):
        check(mode, f"flux_attention_npu_processor[{j}]", got, want, 3e-2 if stub else 0)
    if stub:
        assert torch_npu.calls["npu_fusion_attention"] == 1, dict(torch_npu.calls)

    # All-bf16 attention: the stock NPU processor would call torch_npu even off the NPU (or
    # without torch_npu at all); patched, it matches the plain processor there.
    attn.to(torch.bfloat16)
    bf16_in = {k: v.to(torch.bfloat16) if torch.is_tensor(v) else v for k, v in ref["attn_in"].items()}
    npu_out = attn(**bf16_in)
    attn.set_processor(attention_processor.FluxAttnProcessor2_0())
    for j, (got, want) in enumerate(zip(npu_out, attn(**bf16_in))):
        check(mode, f"flux_attention_npu_processor_bf16[{j}]", got, want, 3e-2 if stub else 0)
    if stub:
        assert torch_npu.calls["npu_fusion_attention"] == 2, dict(torch_npu.calls)


def main() -> None:
    mode, path, src = parse_args()
    if mode == "reference":
        torch.save(reference(), path)
    else:
        patched(mode, torch.load(path, weights_only=True), src)
    print(mode, "ok")


if __name__ == "__main__":
    main()
