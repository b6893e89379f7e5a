"""A stand-in for ``torch_npu`` that computes, on CPU, what its fused kernels compute on an NPU.

Follows the documentation of torch_npu 2.7.1 (Ascend Extension for PyTorch 7.2.0): the kernel pages
of Ascend/op-plugin branch ``7.2.0`` (``docs/context/torch_npu-npu_fusion_attention.md``,
``docs/context/（beta）torch_npu-npu_rms_norm.md``) and, for the HF32 switches, Ascend/pytorch tag
``v7.2.0-pytorch2.7.1`` (``torch_npu/npu/npu_config.py``, ``torch_npu/csrc/framework/LazyInitAclops.cpp``).

No NPU is available here, so the NPU code paths are exercised with this module in place of the
real extension. Each kernel has the documented signature and return tuple, checks the documented
input rules (dtype tables, one dtype for q/k/v/pse, layouts, shape limits, keep_prob range) and
raises where the real kernel would fail, so a test passing with the stand-in means the call itself
is well formed. Calls are counted in ``calls`` to prove a fused path was taken. Where the stand-in
does not compute a documented feature (TND varlen layout, dropout), it says so with
NotImplementedError instead of computing something else.

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

__version__ = "2.7.1+stub"
__all__ = ["__version__", "calls", "npu_rms_norm", "npu_fusion_attention", "npu_rotary_mul", "npu"]

# npu_rms_norm (Atlas A2/A3): valid (x, gamma) dtype pairs; y has x's dtype, rstd is fp32.
RMS_NORM_PAIRS = frozenset({
    (torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
})
# npu_fusion_attention: query/key/value/pse dtypes (fp32 included in 2.7.1), one dtype for all.
FUSION_ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FUSION_ATTENTION_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
MAX_HEAD_DIM = 768
MAX_HEADS = 256

calls: collections.Counter = collections.Counter()


def npu_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6):
    """Returns (y, rstd): y = x / rms(x) * gamma in x's dtype; rstd fp32, x's leading dims then 1s."""
    x = self
    if (x.dtype, gamma.dtype) not in RMS_NORM_PAIRS:
        raise TypeError(f"npu_rms_norm: unsupported (x, gamma) dtypes ({x.dtype}, {gamma.dtype}); "
                        f"valid pairs: {sorted((str(a), str(b)) for a, b in RMS_NORM_PAIRS)}")
    if not 2 <= x.ndim <= 8 or gamma.ndim >= x.ndim or gamma.shape != x.shape[x.ndim - gamma.ndim:]:
        raise ValueError(f"npu_rms_norm: gamma {tuple(gamma.shape)} must equal the trailing dims of x "
                         f"{tuple(x.shape)} (x with 2-8 dims)")
    calls["npu_rms_norm"] += 1
    dims = tuple(range(x.ndim - gamma.ndim, x.ndim))
    x32 = x.to(torch.float32)
    rstd = torch.rsqrt(x32.pow(2).mean(dims, keepdim=True) + epsilon)
    return (x32 * rstd * gamma.to(torch.float32)).to(x.dtype), rstd


def _to_bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        return t.unflatten(-1, (heads, -1)).transpose(1, 2)
    if layout == "SBH":
        return t.unflatten(-1, (heads, -1)).permute(1, 2, 0, 3)
    raise NotImplementedError(f"the stand-in does not compute input_layout={layout!r} (varlen)")


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        return t.transpose(1, 2).flatten(2)
    return t.permute(2, 0, 1, 3).flatten(2)  # SBH


def _check_attention_inputs(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, keep_prob):
    if input_layout not in FUSION_ATTENTION_LAYOUTS:
        raise ValueError(f"npu_fusion_attention: input_layout must be one of {FUSION_ATTENTION_LAYOUTS}, "
                         f"got {input_layout!r}")
    tensors = [query, key, value] + ([pse] if pse is not None else [])
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise TypeError(f"npu_fusion_attention: query, key, value and pse must share a dtype, got "
                        f"{sorted(map(str, dtypes))}")
    if query.dtype not in FUSION_ATTENTION_DTYPES:
        raise TypeError(f"npu_fusion_attention: unsupported dtype {query.dtype}")
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"npu_fusion_attention: keep_prob must be in (0, 1], got {keep_prob}")
    if padding_mask is not None:
        raise ValueError("npu_fusion_attention: padding_mask is not supported")
    if atten_mask is not None and atten_mask.dtype not in (torch.bool, torch.uint8):
        raise TypeError(f"npu_fusion_attention: atten_mask must be bool or uint8, got {atten_mask.dtype}")
    if not 1 <= head_num <= MAX_HEADS:
        raise ValueError(f"npu_fusion_attention: head_num must be in [1, {MAX_HEADS}], got {head_num}")


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
    actual_seq_qlen=None,
    actual_seq_kvlen=None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
):
    """softmax(q k^T * scale + pse, masked) v. Returns the documented 7-tuple: (attention_out in the
    input layout and dtype, softmax_max fp32, softmax_sum fp32, reserved, seed, offset, mask length).
    ``atten_mask``: True / 1 means "masked out" (the opposite of SDPA's boolean mask)."""
    _check_attention_inputs(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, keep_prob)
    if keep_prob != 1.0:
        raise NotImplementedError("the stand-in does not compute dropout (keep_prob < 1)")
    if sparse_mode != 0 or prefix is not None:
        raise NotImplementedError("the stand-in computes sparse_mode=0 (defaultMask) only")
    q, k, v = (_to_bnsd(t, input_layout, head_num) for t in (query, key, value))
    if q.shape[1] != head_num:
        raise ValueError(f"npu_fusion_attention: {head_num} heads but query has {q.shape[1]} ({input_layout})")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"npu_fusion_attention: head dim D={q.shape[-1]} exceeds {MAX_HEAD_DIM}")
    calls["npu_fusion_attention"] += 1
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * float(scale)
    if pse is not None:
        scores = scores + pse.float()
    if atten_mask is not None:
        scores = scores.masked_fill(atten_mask.bool(), float("-inf"))
    softmax_max = scores.amax(-1, keepdim=True)
    softmax_sum = torch.exp(scores - softmax_max).sum(-1, keepdim=True)
    out = torch.matmul(torch.softmax(scores, -1), v.float()).to(query.dtype)
    return _from_bnsd(out, input_layout), softmax_max, softmax_sum, torch.empty(0), 0, 0, 0


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


def _npu_namespace() -> types.SimpleNamespace:
    """torch_npu.npu.*, only what fastvideo.devices touches. HF32 defaults as in 2.7.1: matmul off,
    convolution ON (LazyInitAclops.cpp: "default value is True" for ALLOW_CONV_HF32)."""
    return types.SimpleNamespace(matmul=types.SimpleNamespace(allow_hf32=False),
                                 conv=types.SimpleNamespace(allow_hf32=True))


npu = _npu_namespace()


def make_module() -> types.ModuleType:
    """A fresh ``torch_npu`` module (own call counter) for ``sys.modules``."""
    module = types.ModuleType("torch_npu")
    # importlib.util.find_spec("torch_npu") (used by diffusers) needs a spec on sys.modules entries.
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", loader=None)
    module.__version__ = __version__
    module.calls = collections.Counter()
    module.npu = _npu_namespace()

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


def install(monkeypatch) -> types.ModuleType:
    """Put a fresh stand-in in ``sys.modules["torch_npu"]`` and make fastvideo.devices treat the
    CPU as an NPU, all undone by ``monkeypatch`` after the test. Returns the module (its calls)."""
    import sys

    from fastvideo import devices

    stub = make_module()
    monkeypatch.setitem(sys.modules, "torch_npu", stub)
    monkeypatch.setattr(devices, "_torch_npu", None)
    monkeypatch.setattr(devices, "_torch_npu_checked", False)
    monkeypatch.setattr(devices, "is_npu", lambda device=None: True)
    return stub
