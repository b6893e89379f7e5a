"""The Z-Image family against diffusers' own ZImagePipeline (nobody here wrote it): prompt encoding,
the scheduler's shift, the ODE rollout with and without classifier-free guidance, decoding, FLOPs
against FlopCounterMode, compiled blocks; and the tiny builder's layout. The current library line
only (skipped on the recipe line, saying so)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Z-Image (diffusers' ZImagePipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")

PROMPTS = ["a red cube on a table", "two small birds"]
SEQ = 48  # Qwen3 tokens (the chat template alone takes about 14 of the tiny tokenizer's)
STEPS, SCALE = 4, 5.0


@pytest.fixture(scope="module")
def pipe(tiny_zimage_dir):
    from diffusers import ZImagePipeline

    p = ZImagePipeline.from_pretrained(tiny_zimage_dir)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def cond(tiny_zimage_dir):
    from fastvideo.models.zimage.family import ZImageFamily

    family = ZImageFamily()
    return family.encode_prompts(family.load_text_encoders(tiny_zimage_dir), PROMPTS, SEQ)


def test_tiny_folder_has_the_zimage_layout(tiny_zimage_dir, pipe):
    from fastvideo.models.registry import get_model_family

    index = json.loads((tiny_zimage_dir / "model_index.json").read_text())
    assert index["_class_name"] == "ZImagePipeline"
    config = pipe.transformer.config
    assert config.in_channels == 16 and config.cap_feat_dim == pipe.text_encoder.config.hidden_size
    assert config.n_refiner_layers == 1 and config.n_layers == 2 and sum(config.axes_dims) == config.dim // config.n_heads
    assert type(pipe.vae).__name__ == "AutoencoderKL" and pipe.vae.config.scaling_factor == pytest.approx(0.3611)
    assert not torch.equal(pipe.transformer.cap_pad_token, torch.zeros_like(pipe.transformer.cap_pad_token))
    family = get_model_family("zimage", guidance_scale=SCALE)
    assert family.name == "zimage" and family.check_folder(tiny_zimage_dir) == tiny_zimage_dir
    assert [b.__name__ for b in family.block_classes()] == ["ZImageTransformerBlock"]
    assert len(family.blocks(pipe.transformer)) == 1 + 1 + 2  # noise refiner, context refiner, main blocks


def test_prompt_encoding_equals_the_pipeline(pipe, cond):
    """Each prompt's own tokens (the mask's) equal ZImagePipeline.encode_prompt's list, exactly; the
    padding rows are zero. (encode_prompt rewrites the list it is given: it gets copies.)"""
    from fastvideo.models.zimage import components as C

    embeds, negatives = pipe.encode_prompt(list(PROMPTS), max_sequence_length=SEQ)
    ours = C.caption_list(cond["prompt_embeds"], cond["prompt_mask"])
    assert cond["prompt_embeds"].shape == (2, SEQ, pipe.text_encoder.config.hidden_size)
    assert [o.shape[0] for o in ours] == [e.shape[0] for e in embeds] and ours[0].shape[0] != ours[1].shape[0]
    for a, b in zip(ours, embeds):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    negative = cond["neg_prompt_embeds"][cond["neg_prompt_mask"] > 0.5]
    torch.testing.assert_close(negative, negatives[0], rtol=0, atol=0)
    assert float(cond["prompt_embeds"][0, ours[0].shape[0]:].abs().sum()) == 0.0


def test_timesteps_run_from_noise_to_image_and_quantize_by_floor():
    """Z-Image's t = (1000 - 1000 sigma) / 1000 (0 at noise, 1 at the image); --quantize_timestep
    floors the scheduler timestep first (DanceGRPO's integer timestep), not a rounding."""
    from fastvideo.models.zimage.components import timesteps

    sigma = torch.tensor([0.3337, 0.9999])
    assert timesteps(sigma, 2, "cpu", quantize=True).tolist() == torch.tensor([667.0, 1.0]).div(1000).tolist()
    torch.testing.assert_close(timesteps(sigma, 2, "cpu"), 1 - sigma, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("size, steps", [((64, 64), 4), ((512, 512), 28), ((1024, 1024), 50), ((1360, 768), 8)])
def test_scheduler_shift_gives_the_pipelines_sigmas(size, steps, dynamic):
    """The shift reproduces the scheduler's sigmas for the pipeline's linspace(1, 1/N, N) and mu: the
    static shift of Z-Image's config, and exp(mu) with dynamic shifting."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift

    from fastvideo.models.zimage import components as C
    from fastvideo.sampling.sde import sigma_schedule
    from fastvideo.tools.make_tiny_zimage import ZIMAGE_SCHEDULER_CONFIG

    config = {**ZIMAGE_SCHEDULER_CONFIG, "use_dynamic_shifting": dynamic}
    h, w = size
    seq = (h // 16) * (w // 16)
    assert C.calculate_mu(seq) == pytest.approx(calculate_shift(seq), rel=1e-12)
    sched = FlowMatchEulerDiscreteScheduler.from_config(config)
    sched.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=calculate_shift(seq))
    shift = C.scheduler_shift(config, h, w)
    assert (shift == 3.0) != dynamic
    torch.testing.assert_close(sigma_schedule(steps, shift), sched.sigmas, rtol=0, atol=1e-6)


def _rollout(family, pipe, cond, steps=STEPS, seed=3):
    from fastvideo.models.zimage import components as C
    from fastvideo.sampling.plan import ode_plan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    shift = C.scheduler_shift(dict(pipe.scheduler.config), 64, 64)
    cfg = RolloutConfig(height=64, width=64, sampling_steps=steps, eta=0.0, shift=shift, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    plan = ode_plan(steps, shift)
    return rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(seed), 1, "cpu",
                   plan=plan), plan


@pytest.mark.parametrize("scale", [SCALE, 0.0])
def test_ode_rollout_equals_the_pipeline(pipe, cond, scale):
    """The ODE plan's final latents equal ZImagePipeline's (output_type latent) for the same noise,
    with its classifier-free guidance at the default 5.0 and without (0, Z-Image-Turbo's setting), at
    the scheduler's shift. Tolerance 1e-5 relative (fp32); measured: equal bit for bit. The decoded
    images equal the VAE's own decode of the unnormalised latents."""
    from fastvideo.models.zimage import components as C
    from fastvideo.models.zimage.family import ZImageFamily

    family = ZImageFamily(guidance_scale=scale)
    traj, plan = _rollout(family, pipe, cond)
    lh, lw = traj.layout["latent_h"], traj.layout["latent_w"]
    noise = C.unpack_latents(traj.latents[:, 0], lh, lw)
    ref = pipe(prompt=list(PROMPTS), height=64, width=64, num_inference_steps=STEPS, guidance_scale=scale,
               latents=noise.clone(), max_sequence_length=SEQ, output_type="latent").images
    ours = C.unpack_latents(traj.latents[:, -1], lh, lw)
    assert ours.shape == ref.shape == (2, 16, 8, 8)
    assert not torch.allclose(ours, noise, atol=1e-1)  # it moved
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"guidance {scale}: max |ours - pipeline| / max |pipeline| = {rel:.1e}")
    torch.testing.assert_close(plan.sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)
    z = C.unpack_latents(traj.x0, lh, lw) / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
    ref_img = pipe.vae.decode(z, return_dict=False)[0]
    torch.testing.assert_close(traj.images, (ref_img / 2 + 0.5).clamp(0, 1), rtol=0, atol=1e-5)


def test_cfg_is_one_batched_call_with_gradient_through_both_rows(pipe, cond):
    """v = v_c + s (v_c - v_u) (the pipeline's convention) from one call on [cond; uncond] rows; the
    update's gradient flows through both."""
    from fastvideo.models.base import TensorConditioning
    from fastvideo.models.zimage.family import ZImageFamily

    family, plain = ZImageFamily(guidance_scale=SCALE), ZImageFamily(guidance_scale=0.0)
    layout = family.layout(64, 64, pipe.vae, pipe.transformer)
    uncond = TensorConditioning({"prompt_embeds": cond["neg_prompt_embeds"].expand(2, -1, -1),
                                 "prompt_mask": cond["neg_prompt_mask"].expand(2, -1)}, dict(cond.shared))
    calls = []
    handle = pipe.transformer.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(1), requires_grad=True)
    try:
        v = family.velocity(pipe.transformer, x, 0.7, cond, layout)
        v_u, v_c = (plain.velocity(pipe.transformer, x, 0.7, c, layout) for c in (uncond, cond))
    finally:
        handle.remove()
    assert len(calls) == 3 and (family.velocity_passes, plain.velocity_passes) == (2, 1)
    torch.testing.assert_close(v, v_c + SCALE * (v_c - v_u), rtol=1e-5, atol=1e-5)
    (g,) = torch.autograd.grad(v.sum(), x)
    (g_u,) = torch.autograd.grad(v_u.sum(), x)
    (g_c,) = torch.autograd.grad(v_c.sum(), x)
    torch.testing.assert_close(g, g_c + SCALE * (g_c - g_u), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(g, (1 + SCALE) * g_c, atol=1e-3)


def _meta_as_real(inputs: dict) -> dict:
    g = torch.Generator().manual_seed(0)

    def real(v):
        if isinstance(v, list):
            return [real(t) for t in v]
        return torch.randn(v.shape, generator=g) if isinstance(v, torch.Tensor) else v

    return {k: real(v) for k, v in inputs.items()}


@pytest.mark.parametrize("text_tokens", [32, 40])
def test_transformer_flops_match_flop_counter(pipe, text_tokens):
    """The analytic count equals FlopCounterMode's on the tiny transformer, forward and backward, with
    a caption of 32 tokens and one of 40 (padded to 64 inside); guidance doubles it."""
    from fastvideo.models.zimage import flops as F
    from fastvideo.models.zimage.family import ZImageFamily
    from fastvideo.perf.flops import count_flops

    model = pipe.transformer
    family, config = ZImageFamily(guidance_scale=0.0), dict(pipe.transformer.config)
    layout = family.nominal_layout(64, 64, config)
    inputs = _meta_as_real(family.meta_inputs(config, 2, layout, text_tokens, torch.float32))
    with torch.no_grad():
        fwd = count_flops(lambda: model(**inputs))
    fb = count_flops(lambda: torch.stack(model(**inputs)[0]).square().mean().backward())
    model.zero_grad(set_to_none=True)
    counts = family.transformer_flops(config, 16, text_tokens, 2)
    assert (counts["forward"], counts["forward"] + counts["backward"]) == (fwd, fb)
    d = F.ZImageDims.from_config(config)
    lt = F.padded(text_tokens)
    assert counts["blocks"] == (F.block_flops(d, 32, 2) + F.block_flops(d, lt, 2, modulated=False)
                                + 2 * F.block_flops(d, 32 + lt, 2))
    assert ZImageFamily(guidance_scale=SCALE).transformer_flops(config, 16, text_tokens, 2)["forward"] == 2 * fwd


def test_real_zimage_size():
    """The cost model's Z-Image shape, built on the meta device by diffusers from its config: 6.15e9
    transformer parameters (the "6B")."""
    from diffusers import ZImageTransformer2DModel

    from fastvideo.models.zimage import flops as F

    with torch.device("meta"):
        model = ZImageTransformer2DModel.from_config(F.reference_config(F.Z_IMAGE_6B))
    count = sum(p.numel() for p in model.parameters())
    assert 6.0e9 < count < 6.3e9, count


def test_bad_inputs_fail_with_one_line(tiny_zimage_dir, flux2_embeddings, tmp_path, cond):
    from fastvideo.data.dataset import PromptEmbeddingDataset
    from fastvideo.models.base import EmbeddingDatasetError, EmbeddingShapeError
    from fastvideo.models.zimage import components as C
    from fastvideo.models.zimage.family import ZImageFamily

    family = ZImageFamily(guidance_scale=SCALE)
    # a FLUX.2 embeddings folder (also Qwen3, also with the empty prompt) trained as Z-Image: named
    with pytest.raises(EmbeddingDatasetError, match=r"written for model family 'flux2'.* --model_family zimage"):
        PromptEmbeddingDataset(flux2_embeddings, family=family)
    broken = shutil.copytree(tiny_zimage_dir, tmp_path / "broken")
    shutil.rmtree(broken / "text_encoder")
    with pytest.raises(C.ZImageFolderError, match=r"missing: text_encoder/\. Put a diffusers-layout Z-Image"):
        family.check_folder(broken, family.text_components)
    with pytest.raises(C.ZImageFolderError, match="text_encoder/"):
        family.load_text_encoders(broken)
    rec = cond.record(0)
    _, dims = family.check_record(0, rec)
    with pytest.raises(EmbeddingShapeError, match="negative"):
        family.check_record(0, {**rec, "neg_prompt_mask": rec["neg_prompt_mask"][:-1]})
    with pytest.raises(EmbeddingShapeError, match="prompt_mask"):
        family.check_record(0, {**rec, "prompt_mask": rec["prompt_mask"][:-1]})
    config = json.loads((tiny_zimage_dir / "transformer" / "config.json").read_text())
    family.check_dims(dims, config, SEQ)
    with pytest.raises(EmbeddingShapeError, match="Qwen3-4B"):
        family.check_dims((SEQ, 2 * dims[1]), config)


def test_compiled_blocks_equal_eager(tiny_zimage_dir, cond):
    """--compile's regional compilation of ZImageTransformerBlock (torch's aot_eager backend; fullgraph,
    so a graph break fails): the guided velocity and its gradient equal the eager model's."""
    import torch._dynamo as dynamo

    from fastvideo.models.compile import compile_blocks
    from fastvideo.models.zimage.family import ZImageFamily

    dynamo.reset()
    family = ZImageFamily(guidance_scale=SCALE)
    eager = family.load_transformer(tiny_zimage_dir, "transformer", "cpu", torch.float32)
    compiled = family.load_transformer(tiny_zimage_dir, "transformer", "cpu", torch.float32)
    assert compile_blocks(compiled, family.block_classes(), "aot_eager") == {"ZImageTransformerBlock": 4}
    layout = family.nominal_layout(64, 64, dict(eager.config))
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(0))
    out = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        v = family.velocity(model, x, 0.6, cond, layout)
        v.square().mean().backward()
        out[name] = (v.detach(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(out["compiled"][0], out["eager"][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(out["compiled"][1], out["eager"][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_npu_adapter_computes_the_stock_velocity_without_complex_numbers(tiny_zimage_dir, cond):
    """zimage.npu's adapter (every RMS norm fused, RoPE in real arithmetic, the attention through
    attention_bnsd) run on the CPU: the guided velocity of a batch of unequal captions (so the
    attention is masked) equals the stock model's, and its forward issues no complex or float64 op."""
    import sys
    from pathlib import Path

    from fastvideo.models import npu_ops
    from fastvideo.models.zimage import npu as zimage_npu
    from fastvideo.models.zimage.family import ZImageFamily

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from float64_guard import NoFloat64OnDevice

    family = ZImageFamily(guidance_scale=SCALE)
    stock = family.load_transformer(tiny_zimage_dir, "transformer", "cpu", torch.float32)
    adapted = family.load_transformer(tiny_zimage_dir, "transformer", "cpu", torch.float32)
    assert npu_ops.adapt_for_npu(adapted) == 4 * (1 + 1 + 2) + 1 + 2 * 4  # block norms, cap_embedder's, q/k norms
    assert zimage_npu.adapt_zimage_for_npu(adapted) == 4 and zimage_npu.adapt_zimage_for_npu(adapted) == 0
    layout = family.nominal_layout(64, 64, dict(stock.config))
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = family.velocity(stock, x, 0.6, cond, layout)
        family.velocity(adapted, x, 0.6, cond, layout)  # the tables move to the device once
        with NoFloat64OnDevice() as guard:
            ours = family.velocity(adapted, x, 0.6, cond, layout)
    assert guard.ops > 100
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_fused_attention_takes_a_key_padding_mask(monkeypatch):
    """attention_bnsd with Z-Image's key-padding mask (True: keep, [B, 1, 1, S]) on the NPU path (the
    stand-in torch_npu, whose mask means drop): the fused kernel runs and equals SDPA with the mask."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import npu_stub

    from fastvideo.models import npu_ops

    stub = npu_stub.install(monkeypatch)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=g).to(torch.bfloat16) for _ in range(3))
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]
    out = npu_ops.attention_bnsd(q, k, v, keep)
    assert stub.calls["npu_fusion_attention"] == 1
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=keep)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    unmasked = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert not torch.allclose(out[1].float(), unmasked[1], atol=5e-2)
