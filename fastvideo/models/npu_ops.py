"""Ascend NPU kernels for the FLUX, SD3.5 and Z-Image transformers, installed from outside the model.

Stock diffusers runs FLUX on an NPU slowly or not at all in three places (see docs/npu.md):

1. q/k RMS norms: FLUX's and SD3.5's attention layers normalise q and k with ``RMSNorm`` (diffusers'
   own class; on diffusers 0.42 FLUX uses ``torch.nn.RMSNorm`` instead). :class:`NpuFusedRMSNorm`
   and :class:`NpuFusedTorchRMSNorm` call torch_npu's fused ``npu_rms_norm``, each with its
   class's semantics (output dtype, eps).
2. RoPE: ``FluxPosEmbed`` computes frequencies in float64 (NPU has no float64 kernels for it);
   :class:`NpuFluxPosEmbed` computes the same cos/sin in float32 there.
3. Attention: the fused attention kernel needs one dtype for q, k and v, and under bf16 autocast q
   and k can leave fp32-weight norms as fp32 while v is bf16; :class:`NpuFluxAttnProcessor` casts
   q and k to v's dtype before ``npu_fusion_attention``.

Z-Image (diffusers 0.42) has complex64 RoPE tables and a masked attention of its own:
:func:`adapt_zimage_for_npu` installs :class:`NpuZImageRope` (the same tables as (cos, sin) pairs)
and :class:`NpuZImageAttnProcessor` (real-arithmetic rotation, the fused kernel with its key-padding
mask); its RMS norms are the first item's.

:func:`maybe_adapt_for_npu` applies the first three when, and only when, the device is an NPU. Parameters
are reused, never copied, so state-dict keys, their order and optimizer bindings do not change. Call
it before FSDP wraps the model. Where the library lines differ (module and processor classes) is
answered by :mod:`fastvideo.library_lines`.

Each replacement decides per call whether the fused kernel can run (torch_npu importable and the
tensor on an NPU) and otherwise computes exactly what diffusers computes, so an adapted model moved
to CPU still gives the stock result. This is the only module besides ``fastvideo.devices`` that
names torch_npu.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.normalization import RMSNorm

from fastvideo import devices
from fastvideo.library_lines import flux_blocks

logger = logging.getLogger(__name__)

# The names under which FLUX's and SD3's attention layers keep their q/k RMS norms.
QK_NORM_NAMES = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")
# npu_fusion_attention accepts fp16, bf16 and (since 2.7.1) fp32 (Ascend/op-plugin branch 7.2.0,
# docs/context/torch_npu-npu_fusion_attention.md). fp32 attention still goes through SDPA: the
# fused kernel's fp32 accumulation is not documented, and fp32 runs are the ones the alignment
# method compares across devices.
FUSED_ATTENTION_DTYPES = (torch.float16, torch.bfloat16)


def npu_kernels_for(tensor: torch.Tensor):
    """The torch_npu module when its fused kernels can run on ``tensor``, else None."""
    if not devices.is_npu(tensor.device):
        return None
    return devices.import_torch_npu()


# ----------------------------------------------------------------------------------------- RMSNorm


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """diffusers 0.32 ``RMSNorm`` semantics: statistics in fp32; with a half-precision weight the
    normalised input is cast to it first; without a weight the input dtype is kept. x: [..., D]."""
    y = x * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return y.to(x.dtype)
    if weight.dtype in (torch.float16, torch.bfloat16):
        y = y.to(weight.dtype)
    y = y * weight
    return y if bias is None else y + bias


def _sharing(fused: nn.Module, norm: nn.Module, names: Sequence[str]) -> nn.Module:
    """``fused`` given ``norm``'s own attributes ``names`` (its Parameters themselves, not copies)."""
    for name in names:
        setattr(fused, name, getattr(norm, name))
    return fused


class _NpuFusedNorm(nn.Module):
    """What both fused norms do per call: torch_npu's kernel when it can run on x (an NPU tensor),
    the reference maths otherwise (CPU and CUDA tensors, the tests)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch_npu = npu_kernels_for(x)
        return self._reference(x) if torch_npu is None else self._fused(torch_npu, x)


class NpuFusedRMSNorm(_NpuFusedNorm):
    """RMS norm over the last dimension through ``torch_npu.npu_rms_norm`` on an NPU.

    Same parameters (``weight``, optional ``bias``) and ``eps`` as diffusers' ``RMSNorm``; build one
    from an existing norm with :meth:`from_rms_norm` to share its Parameter objects.
    """

    def __init__(
        self,
        dim: int | Sequence[int],
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        bias: bool = False,
    ):
        super().__init__()
        self.dim = torch.Size((dim,) if isinstance(dim, numbers.Integral) else dim)
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(self.dim)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(self.dim)) if elementwise_affine and bias else None

    @classmethod
    def from_rms_norm(cls, norm: RMSNorm) -> "NpuFusedRMSNorm":
        """A fused norm holding ``norm``'s own Parameters (not copies) and eps."""
        return _sharing(cls(norm.dim, eps=norm.eps, elementwise_affine=False), norm, ("weight", "bias"))

    def extra_repr(self) -> str:
        return f"{tuple(self.dim)}, eps={self.eps}, affine={self.weight is not None}"

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., D] -> [..., D] in the weight's dtype (the input's dtype without a weight)."""
        return rms_norm_reference(x, self.weight, self.bias, self.eps)

    def _fused(self, torch_npu, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            # The kernel always takes a gamma, in the input's dtype.
            gamma = torch.ones(self.dim, dtype=x.dtype, device=x.device)
            return torch_npu.npu_rms_norm(x, gamma, epsilon=self.eps)[0]
        # The kernel needs x and gamma in one dtype; the weight's dtype wins, as in RMSNorm.
        y = torch_npu.npu_rms_norm(x.to(self.weight.dtype), self.weight, epsilon=self.eps)[0]
        return y if self.bias is None else y + self.bias


def torch_rms_norm_eps(eps: float | None, dtype: torch.dtype) -> float:
    """The eps torch.nn.RMSNorm uses: None means the epsilon of the dtype it computes in, float32
    for fp16/bf16/fp32 inputs (ATen's opmath type), not the input dtype's as its docstring says."""
    return torch.finfo(torch.promote_types(dtype, torch.float32)).eps if eps is None else eps


def _torch_norm_gamma(weight: torch.Tensor | None, x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """npu_rms_norm's gamma for torch.nn.RMSNorm semantics (output in x's dtype). The kernel takes
    (x, gamma) as (half, fp32) or in one dtype: an fp32 weight is passed as it is, a half one cast
    to x's dtype (fp32 x with a bf16 weight: torch also computes with the weight in fp32)."""
    if weight is None:
        return torch.ones(shape, dtype=x.dtype, device=x.device)
    return weight if weight.dtype == torch.float32 else weight.to(x.dtype)


class NpuFusedTorchRMSNorm(_NpuFusedNorm):
    """``torch.nn.RMSNorm`` through ``torch_npu.npu_rms_norm`` on an NPU (diffusers 0.42's FLUX q/k
    norms). Same parameter (``weight``), ``normalized_shape`` and ``eps`` (None: see
    :func:`torch_rms_norm_eps`); the output keeps the input's dtype, as torch's does. Build one from
    an existing norm with :meth:`from_torch_rms_norm` to share its Parameter.
    """

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None,
                 elementwise_affine: bool = True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else normalized_shape
        self.normalized_shape = tuple(shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight = nn.Parameter(torch.ones(self.normalized_shape)) if elementwise_affine else None

    @classmethod
    def from_torch_rms_norm(cls, norm: nn.RMSNorm) -> "NpuFusedTorchRMSNorm":
        """A fused norm holding ``norm``'s own weight Parameter (not a copy) and eps."""
        fused = cls(norm.normalized_shape, eps=norm.eps, elementwise_affine=False)
        return _sharing(fused, norm, ("elementwise_affine", "weight"))

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., *normalized_shape] -> same shape and dtype."""
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)  # torch.nn.RMSNorm.forward

    def _fused(self, torch_npu, x: torch.Tensor) -> torch.Tensor:
        eps = torch_rms_norm_eps(self.eps, x.dtype)
        gamma = _torch_norm_gamma(self.weight, x, torch.Size(self.normalized_shape))
        return torch_npu.npu_rms_norm(x, gamma, epsilon=eps)[0]


def fused_rms_norm(norm: nn.Module) -> nn.Module | None:
    """The fused replacement of an RMS norm of either class (diffusers' or torch's), sharing its
    Parameters; None for anything else (already fused ones included)."""
    if isinstance(norm, nn.RMSNorm):
        return NpuFusedTorchRMSNorm.from_torch_rms_norm(norm)
    if isinstance(norm, RMSNorm):
        return NpuFusedRMSNorm.from_rms_norm(norm)
    return None


# -------------------------------------------------------------------------------------------- RoPE


def flux_rope(
    ids: torch.Tensor,
    axes_dim: Sequence[int],
    theta: float,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FLUX's rotary cos/sin, with the angles computed in ``dtype``.

    ids: [S, n_axes] positions (text ids then image ids). Returns (cos, sin), each [S, sum(axes_dim)]
    float32 on ids' device, every frequency repeated twice in a row (pairs rotate together).
    diffusers uses float64 here; float32 moves FLUX's values by about 1e-5 and runs on an NPU.
    """
    if ids.ndim != 2 or ids.shape[-1] != len(axes_dim):
        raise ValueError(
            f"ids must be [S, {len(axes_dim)}] (one column per RoPE axis {tuple(axes_dim)}), "
            f"got {tuple(ids.shape)}"
        )
    cos_parts, sin_parts = [], []
    for axis, dim in enumerate(axes_dim):
        if dim % 2:
            raise ValueError(f"every RoPE axis dimension must be even, got {tuple(axes_dim)}")
        exponents = torch.arange(0, dim, 2, dtype=dtype, device=ids.device) / dim  # [dim/2]
        inv_freq = 1.0 / (theta**exponents)
        angles = ids[:, axis].float().to(dtype)[:, None] * inv_freq[None, :]  # [S, dim/2]
        cos_parts.append(angles.cos().repeat_interleave(2, dim=-1).float())
        sin_parts.append(angles.sin().repeat_interleave(2, dim=-1).float())
    return torch.cat(cos_parts, dim=-1), torch.cat(sin_parts, dim=-1)


class NpuFluxPosEmbed(nn.Module):
    """Drop-in for diffusers' ``FluxPosEmbed`` (no parameters, no buffers). Angles in float32 when
    the ids are on an NPU or MPS, in float64 elsewhere (diffusers 0.32 uses float32 on MPS only)."""

    def __init__(self, theta: float, axes_dim: Sequence[int]):
        super().__init__()
        self.theta = theta
        self.axes_dim = list(axes_dim)

    def extra_repr(self) -> str:
        return f"theta={self.theta}, axes_dim={self.axes_dim}"

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids: [S, n_axes] -> (cos, sin), each [S, sum(axes_dim)] float32."""
        no_float64 = devices.is_npu(ids.device) or ids.device.type == "mps"
        dtype = torch.float32 if no_float64 else torch.float64
        return flux_rope(ids, self.axes_dim, self.theta, dtype)


# --------------------------------------------------------------------------------------- Attention


def attention_bnsd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention on [B, N, S, D] tensors -> [B, N, S, D] (v's dtype on the fused path).

    On an NPU with half-precision v and no mask, or a boolean key-padding mask [B, 1, 1, S] (True:
    keep), this is ``npu_fusion_attention``, with q and k cast to v's dtype first (the kernel needs
    one dtype; q/k come out of fp32 norms under autocast). Otherwise it is
    ``F.scaled_dot_product_attention`` on the tensors as given, like diffusers.
    """
    torch_npu = npu_kernels_for(v)
    fusable_mask = attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.shape[-2] == 1)
    if torch_npu is None or not fusable_mask or v.dtype not in FUSED_ATTENTION_DTYPES:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=0.0)
    drop = None
    if attention_mask is not None:
        # A key-padding mask [B, 1, 1, S] (True: keep, SDPA's sense; Z-Image's batches of unequal
        # captions): the fused kernel's mask means "drop" and is [B, 1, Sq, Skv].
        drop = (~attention_mask).expand(q.shape[0], 1, q.shape[2], k.shape[2])
    return torch_npu.npu_fusion_attention(
        q.to(v.dtype),
        k.to(v.dtype),
        v,
        v.shape[1],
        input_layout="BNSD",
        atten_mask=drop,
        scale=1.0 / math.sqrt(q.shape[-1]),
    )[0]


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, S, N*D] -> [B, N, S, D]."""
    batch, seq, _ = x.shape
    return x.view(batch, seq, heads, -1).transpose(1, 2)


def qkv_heads(attn: nn.Module, x: torch.Tensor, context: bool) -> tuple[torch.Tensor, ...]:
    """Projected, head-split and q/k-normalised (q, k, v) of the image (or context) stream."""
    if context:
        proj = (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
        norms = (attn.norm_added_q, attn.norm_added_k)
    else:
        proj = (attn.to_q, attn.to_k, attn.to_v)
        norms = (attn.norm_q, attn.norm_k)
    q, k, v = (_heads(p(x), attn.heads) for p in proj)
    if norms[0] is not None:
        q = norms[0](q)
    if norms[1] is not None:
        k = norms[1](k)
    return q, k, v


def joint_qkv(attn: nn.Module, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None,
              text_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(q, k, v) [B, N, S, D] of a joint attention and its text token count: the image stream's, and
    with a context the text stream's, before (FLUX) or after (SD3) the image's on the token axis."""
    q, k, v = qkv_heads(attn, hidden_states, context=False)
    if encoder_hidden_states is None:
        return q, k, v, 0
    cq, ck, cv = qkv_heads(attn, encoder_hidden_states, context=True)
    pairs = ((cq, q), (ck, k), (cv, v)) if text_first else ((q, cq), (k, ck), (v, cv))
    q, k, v = (torch.cat(pair, dim=2) for pair in pairs)
    return q, k, v, cq.shape[2]


class NpuFluxAttnProcessor:
    """Attention processor for FLUX's joint (double-stream) and single-stream blocks.

    Same maths as diffusers' ``FluxAttnProcessor2_0`` (0.32) and ``FluxAttnProcessor`` (0.42, without
    its context- and tensor-parallel options): text tokens first, then image tokens; RoPE
    on q and k; output projections only in joint blocks. The attention itself is
    :func:`attention_bnsd` (fused kernel on an NPU, SDPA elsewhere).
    """

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """hidden_states: [B, S_img, C]; encoder_hidden_states: [B, S_txt, C] in joint blocks.
        Returns [B, S, C] (single block) or ([B, S_img, C], [B, S_txt, C]) (joint block)."""
        q, k, v, n_text = joint_qkv(attn, hidden_states, encoder_hidden_states, text_first=True)
        if image_rotary_emb is not None:
            q = apply_rotary_emb(q, image_rotary_emb)
            k = apply_rotary_emb(k, image_rotary_emb)
        out = self._attend(q, k, v, attention_mask)
        out = out.transpose(1, 2).flatten(2).to(q.dtype)  # [B, S, N*D]
        if encoder_hidden_states is None:
            return out
        text, image = out[:, :n_text], out[:, n_text:]
        image = attn.to_out[1](attn.to_out[0](image))  # linear, dropout
        return image, attn.to_add_out(text)

    def _attend(self, q, k, v, attention_mask):
        """[B, N, S, D] (text tokens first) -> [B, N, S, D]; the sequence-parallel processor
        (models/flux/sequence_parallel.py) attends across its sequence group instead."""
        return attention_bnsd(q, k, v, attention_mask)


# ---------------------------------------------------------------------------- real-arithmetic RoPE


def rotate_pairs(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Z-Image's rotary embedding in real arithmetic: x [B, S, N, D] (pairs (2i, 2i + 1) rotate
    together) by freqs [B, S, D / 2, 2] (cos, sin) -> x's shape and dtype, computed in float32."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [B, S, N, D/2, 2]
    cos, sin = freqs[:, :, None, :, 0], freqs[:, :, None, :, 1]
    real = pairs[..., 0] * cos - pairs[..., 1] * sin
    imag = pairs[..., 0] * sin + pairs[..., 1] * cos
    return torch.stack([real, imag], dim=-1).flatten(-2).type_as(x)


# ------------------------------------------------------------------------------------- installing


def _swap_rms_norms(model: nn.Module) -> int:
    """Every RMS norm of either class, wherever it sits (on FLUX and SD3.5, both lines, these are
    the attention layers' q/k norms: 4 per joint block, 2 per single block / SD3.5 second attention)."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            fused = fused_rms_norm(child)
            if fused is not None:
                setattr(parent, name, fused)
                swapped += 1
    return swapped


def _swap_pos_embeds(model: nn.Module) -> int:
    pos_embed = flux_blocks().pos_embed
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, pos_embed):
                setattr(parent, name, NpuFluxPosEmbed(child.theta, child.axes_dim))
                swapped += 1
    return swapped


def _swap_processors(model: nn.Module) -> int:
    stock = flux_blocks().processors
    processor = NpuFluxAttnProcessor()
    swapped = 0
    for module in model.modules():
        # Fused q/k/v projections (diffusers' fuse_qkv_projections) are not what NpuFluxAttnProcessor reads.
        if isinstance(getattr(module, "processor", None), stock) and not getattr(module, "fused_projections", False):
            module.set_processor(processor)
            swapped += 1
    return swapped


def set_processors(model: nn.Module, stock: type | tuple[type, ...], processor) -> int:
    """Give ``processor`` to every attention layer of ``model`` whose processor is a ``stock`` one (a
    family's NPU adapter: Z-Image's, Wan's); the number swapped (0 the second time: idempotent)."""
    swapped = 0
    for module in model.modules():
        if isinstance(getattr(module, "processor", None), stock):
            module.set_processor(processor)
            swapped += 1
    return swapped


def adapt_for_npu(transformer: nn.Module) -> int:
    """Install the NPU kernels in a diffusers FLUX transformer, in place.

    Swaps every diffusers ``RMSNorm`` for :class:`NpuFusedRMSNorm` and every ``torch.nn.RMSNorm``
    for :class:`NpuFusedTorchRMSNorm` (same Parameter objects), every ``FluxPosEmbed`` for
    :class:`NpuFluxPosEmbed`, and every stock FLUX attention processor (0.32:
    ``FluxAttnProcessor2_0`` / ``FluxAttnProcessor2_0_NPU``, 0.42: ``FluxAttnProcessor``) for
    :class:`NpuFluxAttnProcessor`. Idempotent. Returns the number of RMS norms swapped (FLUX: 4 per
    joint block, 2 per single block).
    """
    norms = _swap_rms_norms(transformer)
    pos_embeds = _swap_pos_embeds(transformer)
    processors = _swap_processors(transformer)
    logger.info(
        "NPU kernels installed: %d fused RMS norms, %d float32 RoPE modules, %d attention processors",
        norms,
        pos_embeds,
        processors,
    )
    return norms


def maybe_adapt_for_npu(transformer: nn.Module, device: torch.device | str) -> bool:
    """:func:`adapt_for_npu` if ``device`` is an NPU; returns whether it did."""
    if not devices.is_npu(device):
        return False
    adapt_for_npu(transformer)
    return True
