"""Analytic FLOPs against torch's own FlopCounterMode on diffusers' FLUX modules.

The analytic count is exact (every matmul of diffusers 0.32's FluxTransformer2DModel and VAE
decoder), so the tolerance is tight: a drift means a layer's shape or the model code changed.
"""

from dataclasses import asdict

import pytest
import torch

from fastvideo.perf import flops as F
from fastvideo.models.flux import flops as FX
from fastvideo.tools.make_tiny_flux import PRESETS, transformer_config, vae_config

EXACT = 1e-9


def _inputs(cfg, L, Lt, B, device="cpu"):
    make = (lambda *s: torch.randn(*s)) if device == "cpu" else (lambda *s: torch.empty(*s, device=device))
    return dict(
        hidden_states=make(B, L, cfg["in_channels"]), encoder_hidden_states=make(B, Lt, cfg["joint_attention_dim"]),
        pooled_projections=make(B, cfg["pooled_projection_dim"]), timestep=torch.full((B,), 0.5, device=device),
        guidance=torch.full((B,), 3.5, device=device), img_ids=torch.zeros(L, 3, device=device),
        txt_ids=torch.zeros(Lt, 3, device=device), return_dict=False,
    )


def _rel(a, b):
    return abs(a - b) / b


@pytest.fixture(scope="module")
def tiny_model():
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel.from_config(transformer_config(PRESETS["tiny"]))


@pytest.mark.parametrize("size,text,batch", [(64, 32, 2), (128, 64, 1)])
def test_tiny_forward_backward_and_recompute_match_flop_counter(tiny_model, size, text, batch):
    cfg = transformer_config(PRESETS["tiny"])
    L = F.image_tokens_for(size, size)
    kw = _inputs(cfg, L, text, batch)
    model = tiny_model
    model.eval()
    with torch.no_grad():
        fwd = F.count_flops(lambda: model(**kw))
    model.train()
    model.disable_gradient_checkpointing()
    fb = F.count_flops(lambda: model(**kw)[0].square().mean().backward())
    model.enable_gradient_checkpointing()
    ck = F.count_flops(lambda: model(**kw)[0].square().mean().backward())
    model.disable_gradient_checkpointing()

    a_fwd = FX.transformer_forward_flops(cfg, L, text, batch)
    a_bwd = FX.transformer_backward_flops(cfg, L, text, batch)
    a_rec = FX.transformer_block_flops(cfg, L, text, batch)
    assert _rel(a_fwd, fwd) < EXACT
    assert _rel(a_fwd + a_bwd, fb) < EXACT
    assert _rel(a_fwd + a_bwd + a_rec, ck) < EXACT


def test_small_forward_matches_flop_counter():
    from diffusers import FluxTransformer2DModel

    cfg = transformer_config(PRESETS["small"])
    torch.manual_seed(0)
    model = FluxTransformer2DModel.from_config(cfg).eval()
    for size, text in ((64, 32), (128, 64)):
        L = F.image_tokens_for(size, size)
        kw = _inputs(cfg, L, text, 1)
        with torch.no_grad():
            counted = F.count_flops(lambda: model(**kw))
        assert _rel(FX.transformer_forward_flops(cfg, L, text), counted) < EXACT


def test_flux_dev_forward_and_vae_decode_at_720_match_flop_counter_on_meta():
    """The full-size model costs no memory on the meta device; the counter still sees every matmul."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel

    tcfg = {k: v for k, v in asdict(FX.FLUX_DEV).items() if k != "mlp_ratio"}
    vcfg = dict(FX.FLUX_DEV_VAE_CONFIG, in_channels=3, norm_num_groups=32, use_quant_conv=False,
                down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4)
    with torch.device("meta"):
        model = FluxTransformer2DModel.from_config(tcfg).eval()
        vae = AutoencoderKL.from_config(vcfg).eval()
        kw = _inputs(tcfg, 2025, 512, 1, device="meta")
        with torch.no_grad():
            fwd = F.count_flops(lambda: model(**kw))
            dec = F.count_flops(lambda: vae.decode(torch.empty(1, 16, 90, 90)))
    assert 11.8e9 < sum(p.numel() for p in model.parameters()) < 12.0e9  # it is FLUX.1-dev's size
    assert _rel(FX.transformer_forward_flops(FX.FLUX_DEV, 2025, 512), fwd) < EXACT
    assert _rel(F.vae_decoder_flops(None, 90, 90), dec) < EXACT
    assert 3.7e13 < fwd < 3.75e13 and 5.0e12 < dec < 5.1e12


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_vae_decoder_matches_flop_counter(preset):
    from diffusers import AutoencoderKL

    cfg = vae_config(PRESETS[preset])
    vae = AutoencoderKL.from_config(cfg).eval()
    with torch.no_grad():
        counted = F.count_flops(lambda: vae.decode(torch.randn(1, 16, 8, 12)))
    assert _rel(F.vae_decoder_flops(cfg, 8, 12), counted) < EXACT


def test_dims_from_a_diffusers_config_object_and_errors(tiny_model):
    cfg = transformer_config(PRESETS["tiny"])
    assert FX.FluxDims.from_config(tiny_model.config) == FX.FluxDims.from_config(cfg)
    assert FX.FluxDims.from_config(cfg).inner_dim == 32
    with pytest.raises(ValueError, match="num_layers"):
        FX.FluxDims.from_config({"attention_head_dim": 8})
    with pytest.raises(ValueError, match="positive"):
        FX.transformer_forward_flops(cfg, 0, 8)


def test_image_tokens():
    assert F.image_tokens_for(720, 720) == 2025
    assert F.image_tokens_for(1024, 512) == 64 * 32
    with pytest.raises(ValueError, match="multiple of 16"):
        F.image_tokens_for(720, 721)
