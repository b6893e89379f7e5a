"""A stand-in for ``torch_npu`` that computes, on CPU, what its fused kernels compute on an NPU.

No NPU is available here, so the NPU code paths are exercised with this module in place of the
real extension. Each kernel checks the input constraints the real one documents (one dtype for
its tensor inputs, supported dtypes, layout) and raises where the real kernel would fail or be
skipped, so a test passing with the stand-in means the call itself is well formed. Calls are
counted in ``calls`` to prove a fused path was taken.

In-process use: ``make_module()`` returns a fresh module to put in ``sys.modules["torch_npu"]``
(with pytest's monkeypatch, so it is removed after the test). For a subprocess, a file
``torch_npu.py`` containing ``from npu_stub import *`` on ``sys.path`` (next to this file's folder)
makes ``import torch_npu`` load it.
"""

from __future__ import annotations

import collections
import importlib.machinery
import types

import torch
import torch.nn.functional as F

__version__ = "0.0.0+stub"
__all__ = ["__version__", "calls", "npu_rms_norm", "npu_fusion_attention", "npu_rotary_mul", "npu"]

RMS_NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FUSION_ATTENTION_DTYPES = (torch.float16, torch.bfloat16)

calls: collections.Counter = collections.Counter()


def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6):
    """Returns (y, rstd): y = x / rms(x) * gamma in x's dtype; rstd [..., 1] fp32."""
    if x.dtype != gamma.dtype:
        raise TypeError(f"npu_rms_norm: x ({x.dtype}) and gamma ({gamma.dtype}) must share a dtype")
    if x.dtype not in RMS_NORM_DTYPES:
        raise TypeError(f"npu_rms_norm: unsupported dtype {x.dtype}")
    if gamma.shape != x.shape[-gamma.ndim :]:
        raise ValueError(f"npu_rms_norm: gamma {tuple(gamma.shape)} does not match x {tuple(x.shape)}")
    calls["npu_rms_norm"] += 1
    x32 = x.to(torch.float32)
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + epsilon)
    return (x32 * rstd * gamma.to(torch.float32)).to(x.dtype), rstd


def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse=None,
    padding_mask=None,
    atten_mask=None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    prefix=None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
):
    """BNSD only. Returns a 7-tuple whose first item is the attention output [B, N, S, D]."""
    if input_layout != "BNSD":
        raise NotImplementedError(f"stand-in implements input_layout='BNSD' only, got {input_layout!r}")
    dtypes = {query.dtype, key.dtype, value.dtype}
    if len(dtypes) != 1:
        raise TypeError(f"npu_fusion_attention: q, k, v must share a dtype, got {sorted(map(str, dtypes))}")
    if query.dtype not in FUSION_ATTENTION_DTYPES:
        raise TypeError(f"npu_fusion_attention: unsupported dtype {query.dtype}")
    if query.ndim != 4 or query.shape[1] != head_num:
        raise ValueError(f"npu_fusion_attention: BNSD query with {head_num} heads, got {tuple(query.shape)}")
    if pse is not None or atten_mask is not None or keep_prob != 1.0:
        raise NotImplementedError("stand-in implements unmasked attention without dropout only")
    calls["npu_fusion_attention"] += 1
    out = F.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), scale=float(scale)
    ).to(query.dtype)
    empty = torch.empty(0)
    return out, empty, empty, empty, 0, 0, 0


def npu_rotary_mul(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half"):
    """x * cos + rotate(x) * sin; "interleave" rotates adjacent pairs, "half" the two halves."""
    calls["npu_rotary_mul"] += 1
    if rotary_mode == "interleave":
        even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
        rotated = torch.stack((-odd, even), dim=-1).flatten(-2)
    elif rotary_mode == "half":
        first, second = x.chunk(2, dim=-1)
        rotated = torch.cat((-second, first), dim=-1)
    else:
        raise ValueError(f"rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    return x * r1 + rotated * r2


# torch_npu.npu.* mirrors torch.npu; only what fastvideo.platform touches.
npu = types.SimpleNamespace(matmul=types.SimpleNamespace(allow_hf32=False))


def make_module() -> types.ModuleType:
    """A fresh ``torch_npu`` module (own call counter) for ``sys.modules``."""
    module = types.ModuleType("torch_npu")
    # importlib.util.find_spec("torch_npu") (used by diffusers) needs a spec on sys.modules entries.
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", loader=None)
    module.__version__ = __version__
    module.calls = collections.Counter()
    module.npu = types.SimpleNamespace(matmul=types.SimpleNamespace(allow_hf32=False))

    def counted(fn):
        def wrapper(*args, **kwargs):
            module.calls[fn.__name__] += 1
            return fn(*args, **kwargs)

        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        return wrapper

    for fn in (npu_rms_norm, npu_fusion_attention, npu_rotary_mul):
        setattr(module, fn.__name__, counted(fn))
    return module

