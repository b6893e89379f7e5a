"""The stand-in torch_npu follows torch_npu 2.7.1's documentation (tests/npu_stub.py docstring):
signatures, return tuples, dtype tables, shape limits, mask semantics, HF32 defaults."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import npu_stub


def _qkv(b=2, n=3, s=5, d=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, n, s, d, generator=g).to(dtype) for _ in range(3)]


def test_documented_signatures():
    params = list(inspect.signature(npu_stub.npu_fusion_attention).parameters)
    assert params == ["query", "key", "value", "head_num", "input_layout", "pse", "padding_mask", "atten_mask",
                      "scale", "keep_prob", "pre_tockens", "next_tockens", "inner_precise", "prefix",
                      "actual_seq_qlen", "actual_seq_kvlen", "sparse_mode", "gen_mask_parallel", "sync",
                      "softmax_layout"]
    rms = inspect.signature(npu_stub.npu_rms_norm).parameters
    assert list(rms) == ["self", "gamma", "epsilon"] and rms["epsilon"].default == 1e-6


@pytest.mark.parametrize("x_dtype,g_dtype,ok", [
    (torch.float16, torch.float32, True), (torch.bfloat16, torch.float32, True), (torch.float16, torch.float16, True),
    (torch.bfloat16, torch.bfloat16, True), (torch.float32, torch.float32, True),
    (torch.float32, torch.bfloat16, False), (torch.float16, torch.bfloat16, False), (torch.float64, torch.float64, False),
])
def test_rms_norm_dtype_table(x_dtype, g_dtype, ok):
    x = torch.randn(2, 3, 16).to(x_dtype)
    gamma = torch.rand(16).to(g_dtype) + 0.5
    if not ok:
        with pytest.raises(TypeError, match="unsupported"):
            npu_stub.npu_rms_norm(x, gamma)
        return
    y, rstd = npu_stub.npu_rms_norm(x, gamma, epsilon=1e-5)
    assert y.dtype == x_dtype and rstd.dtype == torch.float32 and rstd.shape == (2, 3, 1)
    ref = torch.nn.functional.rms_norm(x.float(), (16,), gamma.float(), eps=1e-5)
    tol = 1e-6 if x_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.float(), ref, atol=tol, rtol=tol)


def test_rms_norm_shapes():
    with pytest.raises(ValueError, match="trailing dims"):
        npu_stub.npu_rms_norm(torch.randn(2, 16), torch.ones(8))
    with pytest.raises(ValueError, match="2-8 dims"):
        npu_stub.npu_rms_norm(torch.randn(16), torch.ones(16))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fusion_attention_matches_sdpa_and_returns_seven(dtype):
    q, k, v = _qkv(dtype=dtype)
    out = npu_stub.npu_fusion_attention(q, k, v, 3, "BNSD", scale=1 / math.sqrt(8))
    assert len(out) == 7 and out[0].dtype == dtype and out[1].dtype == torch.float32
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out[0].float(), ref, atol=tol, rtol=tol)


def test_fusion_attention_layouts_agree():
    q, k, v = _qkv()
    ref = npu_stub.npu_fusion_attention(q, k, v, 3, "BNSD", scale=0.3)[0]
    bsnd = npu_stub.npu_fusion_attention(*(t.transpose(1, 2) for t in (q, k, v)), 3, "BSND", scale=0.3)[0]
    bsh = npu_stub.npu_fusion_attention(*(t.transpose(1, 2).flatten(2) for t in (q, k, v)), 3, "BSH", scale=0.3)[0]
    sbh = npu_stub.npu_fusion_attention(*(t.permute(2, 0, 1, 3).flatten(2) for t in (q, k, v)), 3, "SBH",
                                        scale=0.3)[0]
    torch.testing.assert_close(bsnd.transpose(1, 2), ref)
    torch.testing.assert_close(bsh.unflatten(-1, (3, 8)).transpose(1, 2), ref)
    torch.testing.assert_close(sbh.unflatten(-1, (3, 8)).permute(1, 2, 0, 3), ref)


def test_fusion_attention_mask_true_means_masked_out():
    q, k, v = _qkv(s=4)
    drop = torch.zeros(4, 4, dtype=torch.bool)
    drop[:, 2:] = True  # keys 2 and 3 take no part
    out = npu_stub.npu_fusion_attention(q, k, v, 3, "BNSD", atten_mask=drop, scale=0.5)[0]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~drop, scale=0.5)  # SDPA: True = keep
    torch.testing.assert_close(out, ref)
    only_first_two = F.scaled_dot_product_attention(q, k[:, :, :2], v[:, :, :2], scale=0.5)
    torch.testing.assert_close(out, only_first_two)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(input_layout="BHSD"), ValueError, "input_layout"),
    (dict(keep_prob=0.0), ValueError, "keep_prob"),
    (dict(keep_prob=1.5), ValueError, "keep_prob"),
    (dict(head_num=257), ValueError, "head_num"),
    (dict(padding_mask=torch.zeros(1)), ValueError, "padding_mask"),
    (dict(atten_mask=torch.zeros(5, 5)), TypeError, "bool or uint8"),
])
def test_fusion_attention_refuses_what_the_kernel_refuses(kwargs, error, match):
    q, k, v = _qkv()
    args = {"head_num": 3, "input_layout": "BNSD", **kwargs}
    with pytest.raises(error, match=match):
        npu_stub.npu_fusion_attention(q, k, v, **args)


def test_fusion_attention_dtype_and_head_dim_limits():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="share a dtype"):
        npu_stub.npu_fusion_attention(q, k.half(), v, 3, "BNSD")
    with pytest.raises(TypeError, match="share a dtype"):
        npu_stub.npu_fusion_attention(q, k, v, 3, "BNSD", pse=torch.zeros(1, 3, 5, 5, dtype=torch.half))
    with pytest.raises(TypeError, match="unsupported dtype"):
        npu_stub.npu_fusion_attention(q.double(), k.double(), v.double(), 3, "BNSD")
    big = torch.zeros(1, 1, 2, 769)
    with pytest.raises(ValueError, match="exceeds 768"):
        npu_stub.npu_fusion_attention(big, big, big, 1, "BNSD")


def test_hf32_defaults():
    module = npu_stub.make_module()
    assert module.npu.matmul.allow_hf32 is False
    assert module.npu.conv.allow_hf32 is True
    assert "2.7.1" in npu_stub.__doc__ and "7.2.0" in npu_stub.__doc__
