"""NPU kernels for FLUX and SD3.5, tested on CPU against the installed diffusers itself (0.32 on
the recipe line, 0.42 on the current line: FLUX's q/k norms are diffusers' RMSNorm on the first and
torch.nn.RMSNorm on the second, SD3.5's are diffusers' RMSNorm on both).

No NPU here: the ``fake_npu`` fixture puts the stand-in ``torch_npu`` (tests/npu_stub.py) in
``sys.modules`` and makes ``devices.is_npu`` answer True, so CPU tensors take the NPU paths. The
stand-in computes the reference function and rejects calls the real kernels reject (mixed dtypes,
fp32 attention), and counts calls to prove the fused paths ran.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from diffusers import FluxTransformer2DModel, SD3Transformer2DModel
from diffusers.models.normalization import RMSNorm

from fastvideo import devices
from fastvideo.library_lines import flux_blocks
from fastvideo.models import npu_ops

FluxPosEmbed = flux_blocks().pos_embed
STOCK_PROCESSOR = flux_blocks().processors[0]
STOCK_NORMS = (RMSNorm, torch.nn.RMSNorm)
FUSED_NORMS = (npu_ops.NpuFusedRMSNorm, npu_ops.NpuFusedTorchRMSNorm)


def _load_stub():
    path = Path(__file__).resolve().parents[1] / "npu_stub.py"
    spec = importlib.util.spec_from_file_location("npu_stub", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


npu_stub = _load_stub()

TINY = dict(
    patch_size=1,
    in_channels=16,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    guidance_embeds=True,
    axes_dims_rope=(4, 6, 6),
)
NORMS_PER_FORWARD = 4 * TINY["num_layers"] + 2 * TINY["num_single_layers"]
BLOCKS = TINY["num_layers"] + TINY["num_single_layers"]


@pytest.fixture
def fake_npu(monkeypatch):
    """Stand-in torch_npu installed, CPU treated as the NPU; all undone after the test."""
    return npu_stub.install(monkeypatch)


def _tiny_flux(seed: int = 0) -> FluxTransformer2DModel:
    torch.manual_seed(seed)
    model = FluxTransformer2DModel(**TINY).eval()
    # diffusers initialises the q/k norm weights to ones; random ones make the norms matter.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".norm_" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
    return model


def _inputs(seed: int = 1, h: int = 4, w: int = 4, n_text: int = 8) -> dict:
    g = torch.Generator().manual_seed(seed)
    img_ids = torch.zeros(h * w, 3)
    img_ids[:, 1] = torch.arange(h).repeat_interleave(w)
    img_ids[:, 2] = torch.arange(w).repeat(h)
    return dict(
        hidden_states=torch.randn(2, h * w, TINY["in_channels"], generator=g),
        encoder_hidden_states=torch.randn(2, n_text, TINY["joint_attention_dim"], generator=g),
        pooled_projections=torch.randn(2, TINY["pooled_projection_dim"], generator=g),
        timestep=torch.tensor([0.3, 0.8]),
        guidance=torch.tensor([3.5, 3.5]),
        img_ids=img_ids,
        txt_ids=torch.zeros(n_text, 3),
    )


@torch.no_grad()
def _run(model, inputs, autocast_dtype=None):
    if autocast_dtype is None:
        return model(**inputs).sample
    with torch.autocast("cpu", dtype=autocast_dtype):
        return model(**inputs).sample


def _module_types(model):
    return [type(m) for m in model.modules()]


def test_cpu_device_leaves_model_untouched():
    model = _tiny_flux()
    before = _module_types(model)
    assert npu_ops.maybe_adapt_for_npu(model, torch.device("cpu")) is False
    assert npu_ops.maybe_adapt_for_npu(model, "cpu") is False
    assert _module_types(model) == before
    attn = model.transformer_blocks[0].attn
    assert type(attn.norm_q) in STOCK_NORMS and type(attn.processor) is STOCK_PROCESSOR
    assert type(model.pos_embed) is FluxPosEmbed


def test_cpu_device_with_torch_npu_importable_still_untouched(monkeypatch):
    # Having torch_npu installed is not the same as running on an NPU: only the device decides.
    monkeypatch.setitem(sys.modules, "torch_npu", npu_stub.make_module())
    model = _tiny_flux()
    assert npu_ops.maybe_adapt_for_npu(model, "cpu") is False
    assert type(model.transformer_blocks[0].attn.norm_q) in STOCK_NORMS


def test_adapted_fp32_output_equals_original_and_takes_fused_norm(fake_npu):
    model = _tiny_flux()
    inputs = _inputs()
    expected = _run(model, inputs)
    keys = list(model.state_dict().keys())
    params = [id(p) for p in model.parameters()]

    assert npu_ops.maybe_adapt_for_npu(model, "npu") is True
    attn = model.transformer_blocks[0].attn
    assert all(isinstance(getattr(attn, n), FUSED_NORMS) for n in npu_ops.QK_NORM_NAMES)
    assert isinstance(model.single_transformer_blocks[0].attn.norm_k, FUSED_NORMS)
    assert isinstance(model.pos_embed, npu_ops.NpuFluxPosEmbed)
    assert isinstance(attn.processor, npu_ops.NpuFluxAttnProcessor)
    assert list(model.state_dict().keys()) == keys
    assert [id(p) for p in model.parameters()] == params

    got = _run(model, inputs)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert fake_npu.calls["npu_rms_norm"] == NORMS_PER_FORWARD
    # fp32 attention is not a fused-kernel dtype: it must have stayed on SDPA
    assert fake_npu.calls["npu_fusion_attention"] == 0


def test_adapted_bf16_autocast_casts_qk_and_takes_fused_attention(fake_npu):
    model = _tiny_flux()
    inputs = _inputs()
    expected = _run(model, inputs, torch.bfloat16)
    npu_ops.adapt_for_npu(model)
    got = _run(model, inputs, torch.bfloat16)
    # On 0.32 q/k leave the fp32-weight norms as fp32 under autocast while v is bf16 (0.42's torch
    # norms keep the input's bf16); the stand-in rejects mixed dtypes, so on 0.32 these calls prove
    # the cast happened.
    assert fake_npu.calls["npu_fusion_attention"] == BLOCKS
    assert fake_npu.calls["npu_rms_norm"] == NORMS_PER_FORWARD
    assert got.dtype == expected.dtype
    scale = expected.float().abs().max()
    assert (got.float() - expected.float()).abs().max() <= 2e-2 * scale


def test_adapted_model_off_npu_computes_stock_result_exactly():
    # adapt_for_npu on a model that then runs on CPU: every replacement falls back to diffusers' maths.
    model = _tiny_flux()
    inputs = _inputs()
    expected = _run(model, inputs)
    assert npu_ops.adapt_for_npu(model) == NORMS_PER_FORWARD
    assert torch.equal(_run(model, inputs), expected)


def test_adapt_is_idempotent(fake_npu):
    model = _tiny_flux()
    assert npu_ops.adapt_for_npu(model) == NORMS_PER_FORWARD
    types_once = _module_types(model)
    assert npu_ops.adapt_for_npu(model) == 0
    assert _module_types(model) == types_once


@pytest.mark.parametrize(
    "affine,bias,w_dtype,x_dtype,atol",
    [
        (True, False, torch.float32, torch.float32, 1e-6),
        (True, False, torch.float32, torch.bfloat16, 1e-6),  # autocast case: fp32 out
        (True, False, torch.bfloat16, torch.float32, 2e-2),
        (True, True, torch.float32, torch.float32, 1e-6),
        (False, False, torch.float32, torch.float32, 1e-6),
        (False, False, torch.float32, torch.bfloat16, 2e-2),
    ],
)
def test_fused_rms_norm_matches_diffusers(fake_npu, affine, bias, w_dtype, x_dtype, atol):
    torch.manual_seed(0)
    ref = RMSNorm(16, eps=1e-6, elementwise_affine=affine, bias=bias)
    if affine:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            if bias:
                ref.bias.uniform_(-0.5, 0.5)
        ref.to(w_dtype)
    x = (torch.randn(2, 3, 5, 16) * 3).to(x_dtype)
    fused = npu_ops.NpuFusedRMSNorm.from_rms_norm(ref)
    assert fused.weight is ref.weight and fused.bias is ref.bias and fused.eps == ref.eps
    expected, got = ref(x), fused(x)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=atol)
    assert fake_npu.calls["npu_rms_norm"] == 1


def test_fused_rms_norm_state_dict_matches_diffusers():
    ref = RMSNorm(8, eps=1e-6, bias=True)
    fused = npu_ops.NpuFusedRMSNorm(8, eps=1e-6, bias=True)
    assert list(fused.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    assert list(npu_ops.NpuFusedRMSNorm(8, elementwise_affine=False).state_dict()) == []


def _flux_ids(grid: int = 64, n_text: int = 512) -> torch.Tensor:
    img = torch.zeros(grid * grid, 3)
    img[:, 1] = torch.arange(grid).repeat_interleave(grid)
    img[:, 2] = torch.arange(grid).repeat(grid)
    return torch.cat([torch.zeros(n_text, 3), img])  # [4608, 3]: text first, as FLUX does


def test_rope_float64_equals_diffusers_and_float32_is_within_2e5():
    ids = _flux_ids()
    axes, theta = (16, 56, 56), 10000
    ref_cos, ref_sin = FluxPosEmbed(theta, list(axes))(ids)
    cos64, sin64 = npu_ops.flux_rope(ids, axes, theta, torch.float64)
    torch.testing.assert_close(cos64, ref_cos, rtol=0, atol=0)
    torch.testing.assert_close(sin64, ref_sin, rtol=0, atol=0)
    cos32, sin32 = npu_ops.flux_rope(ids, axes, theta, torch.float32)
    assert cos32.dtype == sin32.dtype == torch.float32
    worst = max((cos32 - ref_cos).abs().max().item(), (sin32 - ref_sin).abs().max().item())
    assert 0 < worst <= 2e-5, worst


def test_pos_embed_uses_float32_on_npu_only(fake_npu, monkeypatch):
    ids = _flux_ids(grid=16, n_text=8)
    embed = npu_ops.NpuFluxPosEmbed(10000, [16, 56, 56])
    on_npu = embed(ids)
    for got, want in zip(on_npu, npu_ops.flux_rope(ids, [16, 56, 56], 10000, torch.float32)):
        assert torch.equal(got, want)
    monkeypatch.setattr(devices, "is_npu", lambda device=None: torch.device(device).type == "npu")
    for got, want in zip(embed(ids), FluxPosEmbed(10000, [16, 56, 56])(ids)):
        assert torch.equal(got, want)


def test_rope_rejects_bad_ids():
    with pytest.raises(ValueError, match="one column per RoPE axis"):
        npu_ops.flux_rope(torch.zeros(4, 2), (16, 56, 56), 10000)


def test_attention_fallbacks(fake_npu):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.equal(npu_ops.attention_bnsd(q, k, v), want)  # fp32: SDPA
    mask = torch.ones(6, 6, dtype=torch.bool)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    npu_ops.attention_bnsd(qb, kb, vb, attention_mask=mask)  # masked: SDPA
    assert fake_npu.calls["npu_fusion_attention"] == 0
    got = npu_ops.attention_bnsd(q, k, vb)  # fp32 q/k, bf16 v: cast, fused
    assert fake_npu.calls["npu_fusion_attention"] == 1 and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0, atol=3e-2)


# ------------------------------------------- every RMS norm swapped, of either class (0.42: torch's)

TINY_SD3 = dict(
    sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
    joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16, out_channels=4,
    qk_norm="rms_norm", dual_attention_layers=(0,),
)
# SD3.5 with a dual-attention first block: 4 q/k norms per joint attention, 2 in the second attention.
SD3_NORMS = 4 * TINY_SD3["num_layers"] + 2 * len(TINY_SD3["dual_attention_layers"])


def _tiny_sd3(seed: int = 0) -> SD3Transformer2DModel:
    torch.manual_seed(seed)
    model = SD3Transformer2DModel(**TINY_SD3).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".norm_" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
    return model


def _sd3_inputs(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=torch.randn(2, 4, 8, 8, generator=g),
        encoder_hidden_states=torch.randn(2, 6, 16, generator=g),
        pooled_projections=torch.randn(2, 16, generator=g),
        timestep=torch.tensor([300.0, 800.0]),
    )


def _norm_counts(model) -> dict:
    """{class name: number of modules} for the stock and fused RMS norm classes."""
    counts = {}
    for module in model.modules():
        if type(module) in STOCK_NORMS + FUSED_NORMS:
            key = f"{type(module).__module__}.{type(module).__name__}"
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_every_rms_norm_of_either_class_is_swapped_and_fused(fake_npu, family):
    # The norm classes are counted on the model as the installed diffusers builds it, so a class the
    # adapter did not know (diffusers 0.42's FLUX uses torch.nn.RMSNorm) shows up as left over.
    model, inputs, n_norms = (
        (_tiny_flux(), _inputs(), NORMS_PER_FORWARD) if family == "flux" else (_tiny_sd3(), _sd3_inputs(), SD3_NORMS)
    )
    before = [type(m) for m in model.modules() if isinstance(m, STOCK_NORMS)]
    assert len(before) == n_norms
    expected = _run(model, inputs)
    params = [id(p) for p in model.parameters()]

    assert npu_ops.adapt_for_npu(model) == n_norms
    counts = _norm_counts(model)
    leftover = {k: v for k, v in counts.items() if not k.startswith("fastvideo.")}
    assert not leftover, f"RMS norms left unswapped: {leftover}"
    after = [type(m) for m in model.modules() if isinstance(m, FUSED_NORMS)]
    want = [npu_ops.NpuFusedTorchRMSNorm if t is torch.nn.RMSNorm else npu_ops.NpuFusedRMSNorm for t in before]
    assert after == want  # each norm keeps its class's semantics
    assert [id(p) for p in model.parameters()] == params

    got = _run(model, inputs)
    assert fake_npu.calls["npu_rms_norm"] == n_norms  # every norm of the forward pass took the kernel
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_sd3_bf16_autocast_keeps_its_processors_and_stock_result(fake_npu):
    model, inputs = _tiny_sd3(), _sd3_inputs()
    processors = [type(m.processor) for m in model.modules() if hasattr(m, "processor")]
    expected = _run(model, inputs, torch.bfloat16)
    npu_ops.adapt_for_npu(model)
    assert [type(m.processor) for m in model.modules() if hasattr(m, "processor")] == processors
    got = _run(model, inputs, torch.bfloat16)
    assert fake_npu.calls["npu_rms_norm"] == SD3_NORMS
    assert got.dtype == expected.dtype
    assert (got.float() - expected.float()).abs().max() <= 2e-2 * expected.float().abs().max()


@pytest.mark.parametrize(
    "affine,w_dtype,x_dtype,eps,atol",
    [
        (True, torch.float32, torch.float32, 1e-6, 1e-6),
        (True, torch.float32, torch.bfloat16, 1e-6, 2e-2),  # autocast case: bf16 out, fp32 gamma
        (True, torch.bfloat16, torch.float32, 1e-6, 1e-6),  # torch computes with the weight in fp32
        (True, torch.bfloat16, torch.bfloat16, 1e-6, 2e-2),
        (True, torch.float32, torch.float32, None, 1e-6),  # eps None: float32's epsilon (also for bf16)
        (True, torch.float32, torch.bfloat16, None, 2e-2),
        (False, torch.float32, torch.float32, 1e-6, 1e-6),
        (False, torch.float32, torch.bfloat16, None, 2e-2),
    ],
)
def test_fused_torch_rms_norm_matches_torch(fake_npu, affine, w_dtype, x_dtype, eps, atol):
    torch.manual_seed(0)
    ref = torch.nn.RMSNorm(16, eps=eps, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
        ref.to(w_dtype)
    # eps None: small inputs, so that the eps actually used shows (float32's 1.2e-7, for bf16 too)
    x = (torch.randn(2, 3, 5, 16) * (3 if eps else 1e-3)).to(x_dtype)
    fused = npu_ops.NpuFusedTorchRMSNorm.from_torch_rms_norm(ref)
    assert fused.weight is ref.weight and fused.eps == ref.eps
    expected, got = ref(x), fused(x)
    assert got.dtype == expected.dtype == x_dtype
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=atol)
    assert fake_npu.calls["npu_rms_norm"] == 1


@pytest.mark.parametrize("eps", [1e-6, None])
def test_fused_torch_rms_norm_off_npu_is_torch_exactly(eps):
    ref = torch.nn.RMSNorm((4, 16), eps=eps)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
    fused = npu_ops.NpuFusedTorchRMSNorm.from_torch_rms_norm(ref)
    x = torch.randn(3, 4, 16) * 3
    for xx in (x, x.bfloat16()):
        assert torch.equal(fused(xx), ref(xx))
    assert list(fused.state_dict()) == list(ref.state_dict()) == ["weight"]
    bare = torch.nn.RMSNorm(16, elementwise_affine=False)
    assert list(npu_ops.NpuFusedTorchRMSNorm.from_torch_rms_norm(bare).state_dict()) == []
    assert isinstance(npu_ops.fused_rms_norm(ref), npu_ops.NpuFusedTorchRMSNorm)
    assert isinstance(npu_ops.fused_rms_norm(RMSNorm(16, eps=1e-6)), npu_ops.NpuFusedRMSNorm)
    assert npu_ops.fused_rms_norm(fused) is None and npu_ops.fused_rms_norm(torch.nn.LayerNorm(4)) is None
