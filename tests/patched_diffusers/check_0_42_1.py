"""The diffusers 0.42.1 series (patches/diffusers-0.42.1), checked against stock diffusers 0.42.1.

Usage and modes: see common.py. Without torch_npu the patched package must compute exactly what
the stock release computes. With the stand-in torch_npu installed (metadata present, as a real
install) it must first, on CPU tensors, still compute exactly that and call no kernel (the stock
release calls the kernels for any tensor once torch_npu is installed); then, with CPU tensors
standing in for NPU ones, take the fused kernels and agree within the kernels' precision.
"""

from __future__ import annotations

import sys
import types

import torch

from common import TINY, check, flux_ids, flux_inputs, joint_attention_inputs, parse_args, randomise_norm_weights

VERSION = "0.42.1"
QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
# torch.nn.RMSNorm cases (FLUX's q/k norms): (affine, eps, input dtype, input scale).
# eps None with small inputs, so that the eps actually used shows (float32's, for bf16 inputs too).
TORCH_NORMS = [(True, 1e-6, torch.float32, 3.0), (True, 1e-6, torch.bfloat16, 3.0), (True, None, torch.float32, 1e-3),
               (True, None, torch.bfloat16, 1e-3), (False, 1e-6, torch.float32, 3.0), (False, None, torch.bfloat16, 1e-3)]
# Modules that choose a kernel with utils.torch_utils.is_torch_npu_tensor (patch 0002).
NPU_TENSOR_USERS = ("normalization", "activations", "attention_processor", "attention_dispatch")


def _diffusers_norms() -> list[dict]:
    from diffusers.models.normalization import RMSNorm

    cases = []
    for affine, x_dtype in [(True, torch.float32), (True, torch.bfloat16), (False, torch.float32)]:
        norm = RMSNorm(16, eps=1e-6, elementwise_affine=affine)
        if affine:
            norm.weight.uniform_(0.5, 1.5)
        x = (torch.randn(2, 2, 7, 16) * 3).to(x_dtype)
        cases.append({"state": norm.state_dict(), "x": x, "y": norm(x)})
    return cases


def _torch_norms() -> list[dict]:
    cases = []
    for affine, eps, x_dtype, scale in TORCH_NORMS:
        norm = torch.nn.RMSNorm(16, eps=eps, elementwise_affine=affine)
        if affine:
            norm.weight.uniform_(0.5, 1.5)
        x = (torch.randn(2, 2, 7, 16) * scale).to(x_dtype)
        cases.append({"state": norm.state_dict(), "x": x, "y": norm(x)})
    return cases


def _mixed_qkv() -> dict:
    """[B, S, N, D] q/k in fp32 and v in bf16, as diffusers' RMSNorm with fp32 weights leaves them
    under bf16 autocast; "y": stock scaled_dot_product_attention of them under autocast."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    q, k, v = (torch.randn(2, 24, 2, 16) for _ in range(3))
    qkv = {"query": q, "key": k, "value": v.bfloat16()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qkv["y"] = dispatch_attention_fn(**qkv, backend="native")
    return qkv


def _bf16_attention() -> dict:
    """A bf16 diffusers Attention (no q/k norms: AttnProcessorNPU does not apply them) and its stock
    output with the default processor."""
    from diffusers.models.attention_processor import Attention

    attn = Attention(query_dim=32, heads=2, dim_head=16).eval().to(torch.bfloat16)
    x = torch.randn(2, 10, 32).bfloat16()
    return {"state": attn.state_dict(), "x": x, "y": attn(x)}


@torch.no_grad()
def reference() -> dict:
    """Outputs of the installed (stock) diffusers 0.42.1 on fixed inputs."""
    import diffusers
    from diffusers import FluxTransformer2DModel
    from diffusers.models.activations import GEGLU
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, FluxPosEmbed

    assert diffusers.__version__ == VERSION, diffusers.__version__
    torch.manual_seed(0)
    ref = {"norms": _diffusers_norms(), "torch_norms": _torch_norms(), "ids": flux_ids()}
    ref["cos"], ref["sin"] = FluxPosEmbed(10000, [16, 56, 56])(ref["ids"])
    geglu = GEGLU(16, 8)
    ref["geglu"] = {"state": geglu.state_dict(), "x": torch.randn(3, 16)}
    ref["geglu"]["y"] = geglu(ref["geglu"]["x"])

    model = FluxTransformer2DModel(**TINY).eval()
    randomise_norm_weights(model)
    ref.update(state=model.state_dict(), inputs=flux_inputs())
    ref["out"] = model(**ref["inputs"]).sample
    attn = model.transformer_blocks[0].attn
    assert type(attn.norm_q) is torch.nn.RMSNorm and isinstance(attn.processor, FluxAttnProcessor)
    ref["attn_in"] = joint_attention_inputs(model, ref["inputs"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref["attn_out"] = list(attn(**ref["attn_in"]))
    ref["mixed"] = _mixed_qkv()
    ref["bf16_attention"] = _bf16_attention()
    # Stock: the "_native_npu" backend (what FluxAttnProcessor2_0_NPU selects) fails without torch_npu.
    try:
        dispatch_attention_fn(**{k: v for k, v in ref["mixed"].items() if k != "y"}, backend="_native_npu")
        ref["stock_npu_backend_fails"] = False
    except TypeError:
        ref["stock_npu_backend_fails"] = True
    return ref


def _imports(mode: str, src: str):
    """The stand-in torch_npu in stub mode (else None), after checking how diffusers sees torch_npu."""
    import diffusers
    from diffusers.utils import is_torch_npu_available

    assert diffusers.__file__.startswith(src), diffusers.__file__
    if mode == "stub":
        import torch_npu
        from diffusers.models import attention_dispatch

        assert is_torch_npu_available()
        assert attention_dispatch.npu_fusion_attention is torch_npu.npu_fusion_attention
        return torch_npu
    # "broken": torch_npu installed (metadata present) but failing on import, as without CANN; it
    # must count as unavailable, so that nothing imports it.
    assert not is_torch_npu_available()
    assert "torch_npu" not in sys.modules
    return None


def _stand_in_npu_tensors() -> None:
    """From here on every tensor counts as an NPU tensor wherever diffusers asks."""
    import importlib

    for name in NPU_TENSOR_USERS:
        module = importlib.import_module(f"diffusers.models.{name}")
        assert module.is_torch_npu_tensor is not None
        module.is_torch_npu_tensor = lambda tensor: True


def _norms(mode: str, ref: dict, fused: bool) -> None:
    from diffusers.models.normalization import NpuFusedRMSNorm, RMSNorm

    for i, case in enumerate(ref["norms"]):
        norm = RMSNorm(16, eps=1e-6, elementwise_affine="weight" in case["state"])
        norm.load_state_dict(case["state"])
        # same dtype as the stock PyTorch path (an fp32 weight with a bf16 input gives fp32)
        atol = 0 if not fused else (1e-6 if case["x"].dtype == torch.float32 else 1e-2)
        check(mode, f"rms_norm[{i}]", norm(case["x"]), case["y"], atol)
    for i, ((affine, eps, _, _), case) in enumerate(zip(TORCH_NORMS, ref["torch_norms"])):
        norm = NpuFusedRMSNorm(16, eps=eps, elementwise_affine=affine)
        assert isinstance(norm, torch.nn.RMSNorm)
        norm.load_state_dict(case["state"])
        atol = 0 if not fused else (1e-6 if case["x"].dtype == torch.float32 else 1e-2)
        check(mode, f"torch_rms_norm[{i}]", norm(case["x"]), case["y"], atol)


def _flux(mode: str, ref: dict, fused: bool, torch_npu) -> None:
    from diffusers import FluxTransformer2DModel
    from diffusers.models import attention_processor
    from diffusers.models.normalization import NpuFusedRMSNorm
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    cos, sin = FluxPosEmbed(10000, [16, 56, 56])(ref["ids"])
    check(mode, "flux_pos_embed.cos", cos, ref["cos"], 0)
    check(mode, "flux_pos_embed.sin", sin, ref["sin"], 0)
    model = FluxTransformer2DModel(**TINY).eval()
    model.load_state_dict(ref["state"], strict=True)  # same state-dict keys
    attn = model.transformer_blocks[0].attn
    assert all(type(getattr(attn, n)) is NpuFusedRMSNorm for n in QK_NORMS)
    calls = dict(torch_npu.calls) if torch_npu else {}
    check(mode, "flux_transformer", model(**ref["inputs"]).sample, ref["out"], 1e-6 if fused else 0)
    if torch_npu:
        assert torch_npu.calls["npu_rms_norm"] - calls.get("npu_rms_norm", 0) == (6 if fused else 0)
        calls = dict(torch_npu.calls)
    # diffusers' NPU processor (it selects the "_native_npu" attention backend), bf16 autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attn.set_processor(attention_processor.FluxAttnProcessor2_0_NPU())
        out = attn(**ref["attn_in"])
    for j, (got, want) in enumerate(zip(out, ref["attn_out"])):
        check(mode, f"flux_attention_npu_backend[{j}]", got, want, 3e-2 if fused else 0)
    if torch_npu:
        assert torch_npu.calls["npu_fusion_attention"] - calls.get("npu_fusion_attention", 0) == int(fused)


def _npu_backend_mixed_dtypes(mode: str, ref: dict, fused: bool, torch_npu) -> None:
    """The "_native_npu" backend on q/k fp32, v bf16 under autocast: off the NPU the stock SDPA
    result; on it the fused kernel, which the stand-in calls only with one dtype (so q/k were cast)."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    before = torch_npu.calls["npu_fusion_attention"] if torch_npu else 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = dispatch_attention_fn(**{k: v for k, v in ref["mixed"].items() if k != "y"}, backend="_native_npu")
    check(mode, "npu_backend_mixed_qkv", out, ref["mixed"]["y"], 3e-2 if fused else 0)
    if torch_npu:
        assert torch_npu.calls["npu_fusion_attention"] == before + int(fused), dict(torch_npu.calls)


def _geglu(mode: str, ref: dict) -> None:
    from diffusers.models.activations import GEGLU

    geglu = GEGLU(16, 8)
    geglu.load_state_dict(ref["geglu"]["state"])
    check(mode, "geglu", geglu(ref["geglu"]["x"]), ref["geglu"]["y"], 0)


def _transformers_imports_torch_npu() -> bool:
    """Whether importing transformers' models fails on the broken torch_npu: transformers (5.x)
    imports it itself, outside diffusers' reach, and peft, which diffusers' model classes import,
    imports transformers."""
    try:
        import transformers.modeling_utils  # noqa: F401
    except OSError:
        return True
    return False


def _attn_processor_npu(mode: str, ref: dict, fused: bool, torch_npu) -> None:
    """AttnProcessorNPU on bf16 tensors: off the NPU the stock processor's result (the stock NPU
    processor calls the kernel for any half-precision tensor), on it the fused kernel."""
    from diffusers.models.attention_processor import Attention, AttnProcessorNPU

    case = ref["bf16_attention"]
    attn = Attention(query_dim=32, heads=2, dim_head=16).eval().to(torch.bfloat16)
    attn.load_state_dict(case["state"])
    attn.set_processor(AttnProcessorNPU())
    before = torch_npu.calls["npu_fusion_attention"]
    check(mode, "attn_processor_npu_bf16", attn(case["x"]), case["y"], 3e-2 if fused else 0)
    assert torch_npu.calls["npu_fusion_attention"] == before + int(fused), dict(torch_npu.calls)


@torch.no_grad()
def patched(mode: str, ref: dict, src: str) -> None:
    from diffusers.utils.torch_utils import maybe_adjust_dtype_for_device

    assert ref["stock_npu_backend_fails"]
    torch_npu = _imports(mode, src)
    # RoPE: 0.42.1 itself computes FLUX's frequencies in float32 on an NPU (no patch in this series)
    assert maybe_adjust_dtype_for_device(torch.float64, types.SimpleNamespace(type="npu")) is torch.float32
    flux = not (mode == "broken" and _transformers_imports_torch_npu())
    if not flux:
        print("broken: FLUX not checked: transformers imports the failing torch_npu itself (not through diffusers)")
    # CPU tensors, torch_npu installed or not: the plain PyTorch paths, bit for bit, and no kernel call
    _geglu(mode, ref)
    _norms(mode, ref, fused=False)
    _npu_backend_mixed_dtypes(mode, ref, fused=False, torch_npu=torch_npu)
    if flux:
        _flux(mode, ref, fused=False, torch_npu=torch_npu)
    if torch_npu is None:
        return
    _attn_processor_npu(mode, ref, fused=False, torch_npu=torch_npu)
    assert not torch_npu.calls, dict(torch_npu.calls)
    _stand_in_npu_tensors()
    _norms(mode, ref, fused=True)
    assert torch_npu.calls["npu_rms_norm"] == len(ref["norms"]) + len(ref["torch_norms"]), dict(torch_npu.calls)
    _npu_backend_mixed_dtypes(mode, ref, fused=True, torch_npu=torch_npu)
    _flux(mode, ref, fused=True, torch_npu=torch_npu)
    _attn_processor_npu(mode, ref, fused=True, torch_npu=torch_npu)


def main() -> None:
    mode, path, src = parse_args()
    if mode == "reference":
        torch.save(reference(), path)
    else:
        patched(mode, torch.load(path, weights_only=True), src)
    print(mode, "ok")


if __name__ == "__main__":
    main()
