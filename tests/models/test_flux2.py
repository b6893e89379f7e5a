"""The FLUX.2 [klein] family against diffusers' own Flux2KleinPipeline (nobody here wrote it): prompt
encoding, the schedule's size-dependent shift, the ODE rollout with and without classifier-free
guidance, decoding through the VAE's batch-norm statistics, FLOPs against FlopCounterMode; and the
tiny builder's layout. The current library line only (skipped on the recipe line, saying so)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "FLUX.2 [klein] (diffusers' Flux2KleinPipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")

PROMPTS = ["a red cube on a table", "two small birds"]
SEQ = 48  # Qwen3 tokens (the chat template alone takes 28 of the tiny tokenizer's)
STEPS, SCALE = 4, 4.0


@pytest.fixture(scope="module")
def pipe(tiny_flux2_dir):
    from diffusers import Flux2KleinPipeline

    p = Flux2KleinPipeline.from_pretrained(tiny_flux2_dir)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def cond(tiny_flux2_dir):
    from fastvideo.models.flux2.family import Flux2Family

    family = Flux2Family()
    return family.encode_prompts(family.load_text_encoders(tiny_flux2_dir), PROMPTS, SEQ)


def test_tiny_folder_has_the_klein_layout(tiny_flux2_dir, pipe):
    from fastvideo.models.registry import get_model_family

    index = json.loads((tiny_flux2_dir / "model_index.json").read_text())
    assert index["_class_name"] == "Flux2KleinPipeline" and index["is_distilled"] is False
    config = pipe.transformer.config
    assert not config.guidance_embeds and list(config.axes_dims_rope) == [4, 4, 4, 4] and config.in_channels == 128
    assert config.joint_attention_dim == 3 * pipe.text_encoder.config.hidden_size  # three Qwen3 layers per token
    assert type(pipe.text_encoder).__name__ == "Qwen3ForCausalLM" and pipe.text_encoder.config.num_hidden_layers == 36
    assert pipe.vae.config.latent_channels == 32 and not torch.allclose(pipe.vae.bn.running_var, torch.ones(128))
    family = get_model_family("flux2", guidance_scale=SCALE)
    assert family.name == "flux2" and family.check_folder(tiny_flux2_dir) == tiny_flux2_dir
    assert [b.__name__ for b in family.block_classes()] == ["Flux2TransformerBlock", "Flux2SingleTransformerBlock"]
    assert len(family.blocks(pipe.transformer)) == 4


def test_prompt_encoding_equals_the_pipeline(pipe, cond):
    embeds, text_ids = pipe.encode_prompt(PROMPTS, max_sequence_length=SEQ)
    negative, _ = pipe.encode_prompt("", max_sequence_length=SEQ)
    assert cond["prompt_embeds"].shape == (2, SEQ, pipe.transformer.config.joint_attention_dim)
    torch.testing.assert_close(cond["prompt_embeds"], embeds, rtol=0, atol=0)
    torch.testing.assert_close(cond["neg_prompt_embeds"], negative[0], rtol=0, atol=0)
    from fastvideo.models.flux2 import components as C

    assert torch.equal(C.text_ids(SEQ), text_ids[0])  # (0, 0, 0, l)
    assert not torch.equal(cond["prompt_embeds"][0], cond["prompt_embeds"][1])


@pytest.mark.parametrize("size, steps", [((64, 64), 4), ((512, 512), 28), ((1024, 1024), 50), ((1360, 768), 8),
                                          ((1088, 1088), 28), ((1280, 1280), 4), ((2048, 2048), 28)])
def test_schedule_shift_gives_the_pipelines_sigmas(size, steps):
    """exp(mu) as the shift reproduces set_timesteps(mu=compute_empirical_mu(...)) on both branches
    of the empirical fit (above 4300 tokens: 1088 x 1088 has 4624, 1280 x 1280 6400)."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    from fastvideo.models.flux2 import components as C
    from fastvideo.sampling.sde import sigma_schedule
    from fastvideo.tools.make_tiny_flux2 import FLUX2_SCHEDULER_CONFIG

    h, w = size
    seq = (h // 16) * (w // 16)
    assert C.empirical_mu(seq, steps) == pytest.approx(compute_empirical_mu(seq, steps), rel=1e-12)
    sched = FlowMatchEulerDiscreteScheduler.from_config(FLUX2_SCHEDULER_CONFIG)
    import numpy as np

    sched.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=compute_empirical_mu(seq, steps))
    ours = sigma_schedule(steps, C.schedule_shift(h, w, steps))
    torch.testing.assert_close(ours, sched.sigmas, rtol=0, atol=1e-6)


def _rollout(family, pipe, cond, shift, steps=STEPS, seed=3):
    from fastvideo.sampling.plan import ode_plan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    cfg = RolloutConfig(height=64, width=64, sampling_steps=steps, eta=0.0, shift=shift, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    plan = ode_plan(steps, shift)
    return rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(seed), 1, "cpu",
                   plan=plan), plan


@pytest.mark.parametrize("scale", [SCALE, 1.0])
def test_ode_rollout_equals_the_pipeline(pipe, cond, scale):
    """The ODE plan's final latents equal Flux2KleinPipeline's (output_type latent: un-normalised by
    the batch-norm statistics and unpatchified) for the same noise, with true CFG at the pipeline's
    default 4.0 and without it, at the pipeline's own size-dependent schedule (--pipeline_shift).
    Tolerance 1e-5 relative (fp32): the same operations, but the pipeline runs the two guidance
    passes as two calls where this is one batched call, and computes its sigmas in numpy."""
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2.family import Flux2Family

    family = Flux2Family(guidance_scale=scale)
    traj, plan = _rollout(family, pipe, cond, family.schedule_shift(64, 64, STEPS))
    gh, gw = traj.layout["grid_h"], traj.layout["grid_w"]
    noise = C.to_grid(traj.latents[:, 0], gh, gw)
    ref = pipe(prompt=PROMPTS, height=64, width=64, num_inference_steps=STEPS, guidance_scale=scale,
               latents=noise.clone(), max_sequence_length=SEQ, output_type="latent").images
    mean, std = C.latent_statistics(pipe.vae)
    ours = C.unpatchify(C.to_grid(traj.latents[:, -1], gh, gw) * std + mean)
    assert ours.shape == ref.shape == (2, 32, 8, 8)
    assert not torch.allclose(C.to_grid(traj.latents[:, -1], gh, gw), noise, atol=1e-1)  # it moved
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"guidance {scale}: max |ours - pipeline| / max |pipeline| = {rel:.1e}")
    torch.testing.assert_close(plan.sigmas, pipe.scheduler.sigmas, rtol=0, atol=1e-6)
    # images: the family decodes x0 as the pipeline's non-latent path (statistics, unpatchify, decoder)
    x0 = C.unpatchify(C.to_grid(traj.x0, gh, gw) * std + mean)
    ref_img = pipe.vae.decode(x0, return_dict=False)[0]
    torch.testing.assert_close(traj.images, (ref_img / 2 + 0.5).clamp(0, 1), rtol=0, atol=1e-5)


def test_distilled_checkpoint_runs_without_guidance_and_refuses_a_scale(tiny_flux2_dir, pipe, cond, tmp_path):
    """A step-distilled klein (is_distilled): the pipeline ignores its guidance_scale; the family at
    scale 1 equals it, and a scale above 1 is refused by the folder check with the fix."""
    from diffusers import Flux2KleinPipeline

    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2.family import Flux2Family

    distilled = shutil.copytree(tiny_flux2_dir, tmp_path / "distilled")
    index = json.loads((distilled / "model_index.json").read_text())
    (distilled / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    with pytest.raises(C.Flux2FolderError, match=r"step-distilled .* --guidance_scale is 4: pass --guidance_scale 1"):
        Flux2Family(guidance_scale=4.0).check_folder(distilled)
    Flux2Family(guidance_scale=1.0).check_folder(distilled)
    Flux2Family().check_folder(distilled)  # built without settings (preflight, cost model): no claim to check
    family = Flux2Family(guidance_scale=1.0)
    traj, _ = _rollout(family, pipe, cond, family.schedule_shift(64, 64, STEPS))
    dpipe = Flux2KleinPipeline.from_pretrained(distilled)
    dpipe.set_progress_bar_config(disable=True)
    gh, gw = traj.layout["grid_h"], traj.layout["grid_w"]
    ref = dpipe(prompt=PROMPTS, height=64, width=64, num_inference_steps=STEPS, guidance_scale=4.0,  # ignored
                latents=C.to_grid(traj.latents[:, 0], gh, gw), max_sequence_length=SEQ, output_type="latent").images
    mean, std = C.latent_statistics(pipe.vae)
    torch.testing.assert_close(C.unpatchify(C.to_grid(traj.latents[:, -1], gh, gw) * std + mean), ref,
                               rtol=1e-5, atol=1e-5)


def test_cfg_is_one_batched_call_with_gradient_through_both_rows(pipe, cond):
    from fastvideo.models.base import TensorConditioning
    from fastvideo.models.flux2.family import Flux2Family

    family, plain = Flux2Family(guidance_scale=SCALE), Flux2Family(guidance_scale=1.0)
    layout = family.layout(64, 64, pipe.vae, pipe.transformer)
    uncond = TensorConditioning({"prompt_embeds": cond["neg_prompt_embeds"].expand(2, -1, -1)}, dict(cond.shared))
    calls = []
    handle = pipe.transformer.register_forward_hook(lambda *a: calls.append(1))
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(1), requires_grad=True)
    try:
        v = family.velocity(pipe.transformer, x, 0.7, cond, layout)
        v_u, v_c = plain.velocity(pipe.transformer, x, 0.7, uncond, layout), plain.velocity(pipe.transformer, x, 0.7,
                                                                                          cond, layout)
    finally:
        handle.remove()
    assert len(calls) == 3 and (family.velocity_passes, plain.velocity_passes) == (2, 1)
    torch.testing.assert_close(v, v_u + SCALE * (v_c - v_u), rtol=1e-5, atol=1e-5)
    # Flow-Factory's klein trainer keeps the unconditional pass in the graph: d v / d x is the guided combination
    (g,) = torch.autograd.grad(v.sum(), x)
    (g_u,) = torch.autograd.grad(v_u.sum(), x)
    (g_c,) = torch.autograd.grad(v_c.sum(), x)
    torch.testing.assert_close(g, g_u + SCALE * (g_c - g_u), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(g, SCALE * g_c, atol=1e-3)


def test_transformer_flops_match_flop_counter(pipe):
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2 import flops as F
    from fastvideo.models.flux2.family import Flux2Family
    from fastvideo.perf.flops import count_flops

    model = pipe.transformer
    family, config = Flux2Family(guidance_scale=1.0), dict(pipe.transformer.config)
    layout = family.nominal_layout(64, 64, config)
    inputs = {k: (torch.randn(v.shape) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for k, v in family.meta_inputs(config, 2, layout, SEQ, torch.float32).items()}
    inputs["img_ids"], inputs["txt_ids"] = layout["image_ids"], C.text_ids(SEQ)  # the meta ids as real ones
    with torch.no_grad():
        fwd = count_flops(lambda: model(**inputs))
    fb = count_flops(lambda: model(**inputs)[0].square().mean().backward())
    model.zero_grad(set_to_none=True)
    counts = family.transformer_flops(config, 16, SEQ, 2)
    assert (counts["forward"], counts["forward"] + counts["backward"]) == (fwd, fb)
    d = F.Flux2Dims.from_config(config)
    assert counts["blocks"] == 2 * F.double_block_flops(d, 16, SEQ, 2) + 2 * F.single_block_flops(d, 16, SEQ, 2)
    assert Flux2Family(guidance_scale=SCALE).transformer_flops(config, 16, SEQ, 2)["forward"] == 2 * fwd


def test_real_klein_sizes():
    """The cost model's FLUX.2 [klein] shapes, built on the meta device by diffusers from their configs:
    4B has 3.9e9 transformer parameters, 9B 9.1e9 (the names count the transformer alone)."""
    from diffusers import Flux2Transformer2DModel

    from fastvideo.models.flux2 import flops as F

    counts = {}
    for name, dims in (("4B", F.KLEIN_4B), ("9B", F.KLEIN_9B)):
        with torch.device("meta"):
            model = Flux2Transformer2DModel.from_config(F.reference_config(dims))
        counts[name] = sum(p.numel() for p in model.parameters())
    assert 3.7e9 < counts["4B"] < 4.1e9 and 8.8e9 < counts["9B"] < 9.4e9, counts


def test_bad_inputs_fail_with_one_line(tiny_flux2_dir, tiny_embeddings, tmp_path, cond):
    from fastvideo.data.dataset import PromptEmbeddingDataset
    from fastvideo.models.base import EmbeddingDatasetError, EmbeddingShapeError
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2.family import Flux2Family

    family = Flux2Family(guidance_scale=SCALE)
    # a FLUX.1 embeddings folder trained as FLUX.2: named, before any model loads
    with pytest.raises(EmbeddingDatasetError, match=r"written for model family 'flux'.* --model_family flux2"):
        PromptEmbeddingDataset(tiny_embeddings, family=family)
    # a folder without its text encoder
    broken = shutil.copytree(tiny_flux2_dir, tmp_path / "broken")
    shutil.rmtree(broken / "text_encoder")
    with pytest.raises(C.Flux2FolderError, match=r"missing: text_encoder/\. Put a diffusers-layout FLUX.2"):
        family.check_folder(broken, family.text_components)
    with pytest.raises(C.Flux2FolderError, match="text_encoder/"):
        family.load_text_encoders(broken)
    rec = cond.record(0)
    _, dims = family.check_record(0, rec)
    with pytest.raises(EmbeddingShapeError, match="negative"):
        family.check_record(0, {**rec, "neg_prompt_embeds": rec["neg_prompt_embeds"][:-1]})
    config = json.loads((tiny_flux2_dir / "transformer" / "config.json").read_text())
    family.check_dims(dims, config, SEQ)
    with pytest.raises(EmbeddingShapeError, match="Qwen3-4B"):
        family.check_dims((SEQ, 2 * dims[1]), config)


def test_decode_needs_the_batch_norm_statistics(pipe):
    """decode = the pipeline's non-latent path: z x sqrt(running_var + eps) + running_mean, unpatchify,
    the decoder; leaving out the mean or the std changes the image (the tiny VAE's statistics are not 0 / 1)."""
    from fastvideo.models.flux2 import components as C

    x = torch.randn(1, 16, 128, generator=torch.Generator().manual_seed(0))
    bn = pipe.vae.bn
    mean, std = bn.running_mean.view(1, -1, 1, 1), (bn.running_var.view(1, -1, 1, 1) + 1e-4).sqrt()
    grid = C.to_grid(x, 4, 4)
    with torch.no_grad():
        img = C.decode_latents(pipe.vae, x, 4, 4)
        variants = [pipe.vae.decode(C.unpatchify(z), return_dict=False)[0]
                    for z in (grid * std + mean, grid * std, grid + mean)]
    ref, no_mean, no_std = ((v / 2 + 0.5).clamp(0, 1) for v in variants)
    assert img.shape == (1, 3, 64, 64) and math.isfinite(float(img.sum()))
    torch.testing.assert_close(img, ref, rtol=0, atol=1e-6)
    assert not torch.allclose(img, no_mean, atol=1e-3) and not torch.allclose(img, no_std, atol=1e-3)


def test_compiled_blocks_equal_eager(tiny_flux2_dir):
    """--compile's regional compilation of the family's two block classes (torch's aot_eager backend:
    Dynamo's capture without code generation; fullgraph, so a graph break fails): the velocity and
    its gradient equal the eager model's."""
    import torch._dynamo as dynamo

    from fastvideo.models.compile import compile_blocks
    from fastvideo.models.flux2.family import Flux2Family

    dynamo.reset()
    family = Flux2Family(guidance_scale=SCALE)
    eager = family.load_transformer(tiny_flux2_dir, "transformer", "cpu", torch.float32)
    compiled = family.load_transformer(tiny_flux2_dir, "transformer", "cpu", torch.float32)
    counts = compile_blocks(compiled, family.block_classes(), "aot_eager")
    assert counts == {"Flux2TransformerBlock": 2, "Flux2SingleTransformerBlock": 2}
    from fastvideo.models.base import TensorConditioning

    g = torch.Generator().manual_seed(0)
    cond = TensorConditioning({"prompt_embeds": torch.randn(2, 8, 48, generator=g)},
                              {"neg_prompt_embeds": torch.randn(8, 48, generator=g)})
    layout = family.nominal_layout(64, 64, dict(eager.config))
    x = torch.randn(2, *layout.tokens, generator=g)
    out = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        v = family.velocity(model, x, 0.6, cond, layout)
        v.square().mean().backward()
        out[name] = (v.detach(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(out["compiled"][0], out["eager"][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(out["compiled"][1], out["eager"][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
