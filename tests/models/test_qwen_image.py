"""The Qwen-Image family against diffusers' own QwenImagePipeline (nobody here wrote it): prompt
encoding (template, dropped prefix, mask), the scheduler's size-dependent shift, the ODE rollout with
and without true CFG, decoding through the 3D VAE's statistics, FLOPs against FlopCounterMode, compiled
blocks, the NPU adapter; and the tiny builder's layout. The current library line only (skipped on the
recipe line, saying so)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Qwen-Image (diffusers' QwenImagePipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")

PROMPTS = ["a red cube on a table", "two small birds"]
SEQ = 48  # Qwen2.5-VL tokens after the template's prefix
STEPS, SCALE = 4, 4.0


@pytest.fixture(scope="module")
def pipe(tiny_qwen_image_dir):
    from diffusers import QwenImagePipeline

    p = QwenImagePipeline.from_pretrained(tiny_qwen_image_dir)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def cond(tiny_qwen_image_dir):
    from fastvideo.models.qwen_image.family import QwenImageFamily

    family = QwenImageFamily()
    return family.encode_prompts(family.load_text_encoders(tiny_qwen_image_dir), PROMPTS, SEQ)


def test_tiny_folder_has_the_qwen_image_layout(tiny_qwen_image_dir, pipe):
    from fastvideo.models.registry import get_model_family
    from fastvideo.tools.make_tiny_qwen_image import SYSTEM_PREFIX

    index = json.loads((tiny_qwen_image_dir / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImagePipeline"
    assert type(pipe.text_encoder).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert type(pipe.vae).__name__ == "AutoencoderKLQwenImage" and pipe.vae_scale_factor == 8
    config = pipe.transformer.config
    assert config.in_channels == 64 and config.joint_attention_dim == pipe.text_encoder.config.text_config.hidden_size
    assert sum(config.axes_dims_rope) == config.attention_head_dim
    # the template's prefix is the 34 tokens the pipeline drops, as with the real tokenizer
    assert len(pipe.tokenizer(SYSTEM_PREFIX).input_ids) == pipe.prompt_template_encode_start_idx == 34
    family = get_model_family("qwen_image", guidance_scale=SCALE)
    assert family.name == "qwen_image" and family.check_folder(tiny_qwen_image_dir) == tiny_qwen_image_dir
    assert [b.__name__ for b in family.block_classes()] == ["QwenImageTransformerBlock"]
    assert len(family.blocks(pipe.transformer)) == 2
    image = pipe("a red cube", negative_prompt=" ", height=64, width=64, num_inference_steps=2, output_type="pt",
                 generator=torch.Generator().manual_seed(0)).images
    assert image.shape == (1, 3, 64, 64) and float(image.std()) > 0


def test_prompt_encoding_equals_the_pipeline(pipe, cond):
    """The stored embeddings, cut where the pipeline's batch ends, equal QwenImagePipeline.encode_prompt's
    exactly (atol 0), with its mask; the negative " " likewise; the padding rows are zero."""
    from fastvideo.models.qwen_image import components as C

    embeds, mask = pipe.encode_prompt(list(PROMPTS), max_sequence_length=SEQ)
    assert cond["prompt_embeds"].shape == (2, SEQ, pipe.text_encoder.config.text_config.hidden_size)
    n = embeds.shape[1]
    ours, ours_mask = C.trimmed(cond["prompt_embeds"], cond["prompt_mask"])
    assert ours.shape[1] == n and mask is not None and not bool(mask.all())
    torch.testing.assert_close(ours, embeds.detach(), rtol=0, atol=0)
    assert torch.equal(ours_mask, mask.bool())
    neg, neg_mask = pipe.encode_prompt([" "], max_sequence_length=SEQ)
    assert neg_mask is None  # one prompt, no padding: the pipeline passes no mask; neither does trimmed
    k = neg.shape[1]
    torch.testing.assert_close(cond["neg_prompt_embeds"][:k], neg[0].detach(), rtol=0, atol=0)
    assert float(cond["neg_prompt_mask"].sum()) == k
    assert float(cond["prompt_embeds"][1, int(cond["prompt_mask"][1].sum()):].abs().sum()) == 0.0


def test_long_prompts_are_cut_at_max_sequence_length(pipe, cond, tiny_qwen_image_dir):
    from fastvideo.models.qwen_image import components as C
    from fastvideo.models.qwen_image.family import QwenImageFamily

    long = ["a very long prompt about " + "red cubes and blue spheres " * 6]
    enc = QwenImageFamily().load_text_encoders(tiny_qwen_image_dir)
    embeds, mask = C.encode_prompts(enc, long, 16)
    ref, ref_mask = pipe.encode_prompt(long, max_sequence_length=16)
    assert ref.shape[1] == 16 and float(mask.sum()) == 16 and ref_mask is None
    torch.testing.assert_close(embeds, ref.detach(), rtol=0, atol=0)


def test_quantized_timesteps_are_floored_as_dancegrpo():
    """--quantize_timestep: floor(1000 sigma) / 1000 (DanceGRPO's integer timestep), not a rounding;
    without it the pipeline's 1000 sigma / 1000. Per sample from a scalar or a [B] sigma."""
    from fastvideo.models.qwen_image.components import timesteps

    sigma = torch.tensor([0.3337, 0.9999])
    assert timesteps(sigma, 2, "cpu", quantize=True).tolist() == torch.tensor([333.0, 999.0]).div(1000).tolist()
    torch.testing.assert_close(timesteps(sigma, 2, "cpu"), sigma, rtol=1e-6, atol=0)
    assert timesteps(torch.tensor(0.5006), 3, "cpu", quantize=True).tolist() == [0.5] * 3


@pytest.mark.parametrize("size", [(64, 64), (512, 512), (1024, 1024), (1328, 1328), (1664, 928)])
def test_scheduler_shift_gives_the_pipelines_sigmas(size):
    """exp(mu) of the pipeline's calculate_shift reproduces the scheduler's exponential time shift
    (shift_terminal set aside: the training grid does not stretch, docs/qwen_image.md); the family's
    --pipeline_shift is that shift at Qwen-Image's scheduler's end points."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    from fastvideo.models.qwen_image import components as C
    from fastvideo.models.qwen_image.family import QwenImageFamily
    from fastvideo.sampling.sde import sigma_schedule
    from fastvideo.tools.make_tiny_qwen_image import QWEN_IMAGE_SCHEDULER_CONFIG

    config = {**QWEN_IMAGE_SCHEDULER_CONFIG, "shift_terminal": None}
    h, w = size
    seq = (h // 16) * (w // 16)
    mu = calculate_shift(seq, 256, 8192, 0.5, 0.9)
    assert C.calculate_mu(seq) == pytest.approx(mu, rel=1e-12)
    for steps in (4, 20, 50):
        sched = FlowMatchEulerDiscreteScheduler.from_config(config)
        sched.set_timesteps(steps, sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        shift = C.scheduler_shift(config, h, w)
        assert shift == pytest.approx(QwenImageFamily().schedule_shift(h, w, steps), rel=1e-12)
        torch.testing.assert_close(sigma_schedule(steps, shift), sched.sigmas, rtol=0, atol=1e-6)


def _rollout(family, pipe, cond, sigmas, seed=3):
    from fastvideo.sampling.plan import ODE, SamplingPlan
    from fastvideo.sampling.randomness import RandomSource
    from fastvideo.sampling.rollout import RolloutConfig, rollout

    steps = len(sigmas) - 1
    cfg = RolloutConfig(height=64, width=64, sampling_steps=steps, eta=0.0, shift=1.0, num_generations=1,
                        rollout_batch_size=2, init_same_noise=False)
    plan = SamplingPlan(sigmas=sigmas, kinds=(ODE,) * steps, trainable=(), num_trained=0)
    return rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], cfg, RandomSource(seed), 1, "cpu",
                   plan=plan)


def _trainer_sigmas(family, height, width, steps):
    """The trainer's own grid: the family's --pipeline_shift, Flow-GRPO's SDE plan on the default
    shifted_linspace grid, stretched to the family's schedule_terminal (Trainer.sampling_plan)."""
    from fastvideo.sampling.plan import full_sde_plan, on_grid

    shift = family.schedule_shift(height, width, steps)
    plan = full_sde_plan(steps, shift, steps, 1)
    return on_grid(plan, "shifted_linspace", steps, shift, family.schedule_terminal()).sigmas


@pytest.mark.parametrize("size, steps", [(384, 10), (1024, 28)])
def test_the_training_grid_is_the_pipelines_with_shift_terminal(pipe, size, steps):
    """The stock QwenImagePipeline's scheduler after a call at this size and step count (its
    exponential shift at the image's mu, then the stretch to shift_terminal 0.02): the trainer's grid
    equals its sigmas and timesteps to 1e-6 (timesteps relative); the last non-zero sigma is 0.02."""
    from fastvideo.models.qwen_image.family import QwenImageFamily

    assert pipe.scheduler.config.shift_terminal == QwenImageFamily().schedule_terminal() == 0.02
    pipe(prompt="a cube", height=size, width=size, num_inference_steps=steps, max_sequence_length=8,
         output_type="latent")
    ours = _trainer_sigmas(QwenImageFamily(), size, size, steps)
    torch.testing.assert_close(ours, pipe.scheduler.sigmas.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[:-1] * 1000, pipe.scheduler.timesteps.float(), rtol=1e-6, atol=0)
    assert float(ours[-2]) == pytest.approx(0.02, abs=1e-7) and float(ours[-1]) == 0.0


@pytest.mark.parametrize("scale", [SCALE, 1.0])
def test_ode_rollout_equals_the_pipeline(pipe, cond, scale):
    """The ODE rollout on the trainer's own grid (the family's shift, stretched to its scheduler's
    shift_terminal 0.02: the stock scheduler's sigmas within 1e-6) equals QwenImagePipeline's latents (output_type latent) for the same noise,
    with true CFG 4.0 and negative prompt " " and without (1.0). Tolerance 1e-5 relative (fp32);
    measured on the tiny model, 64 px, 4 steps, prompts of 22 and 19 tokens: 2.9e-7 with CFG (the
    batched [cond; uncond] call masks the shorter text where the pipeline's separate calls do not),
    0.0 (bit for bit) without. The decoded images equal the pipeline's own decode."""
    from fastvideo.models.qwen_image.family import QwenImageFamily

    family = QwenImageFamily(guidance_scale=scale)
    sigmas = _trainer_sigmas(family, 64, 64, STEPS)  # the trainer's own grid, shift_terminal included
    traj = _rollout(family, pipe, cond, sigmas)
    noise = traj.latents[:, 0]
    neg = " " if scale > 1 else None
    ref = pipe(prompt=list(PROMPTS), negative_prompt=neg, true_cfg_scale=scale, height=64, width=64,
               num_inference_steps=STEPS, latents=noise.clone(), max_sequence_length=SEQ, output_type="latent").images
    ours = traj.latents[:, -1]
    assert ours.shape == ref.shape == (2, 16, 64)
    assert not torch.allclose(ours, noise, atol=1e-1)  # it moved
    rel = float((ours - ref).abs().max() / ref.abs().max())
    print(f"true_cfg_scale {scale}: max |ours - pipeline| / max |pipeline| = {rel:.1e}")
    assert rel <= 1e-5
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas.float(), rtol=0, atol=1e-6)
    img = pipe(prompt=list(PROMPTS), negative_prompt=neg, true_cfg_scale=scale, height=64, width=64,
               num_inference_steps=STEPS, latents=noise.clone(), max_sequence_length=SEQ, output_type="pt").images
    torch.testing.assert_close(traj.images, img, rtol=0, atol=1e-5)


def test_the_negative_prompt_is_the_model_cards_and_differs_from_flow_factorys(pipe, cond):
    """The family encodes " " (Qwen-Image's model card) where Flow-Factory encodes "" (issue 50 item 5):
    the stored negative is the pipeline's " ", and "" guides elsewhere (docs/qwen_image.md has the
    figures on 4 prompts: latents 1.2% apart; here 2 prompts, the same order of size)."""
    from fastvideo.models.qwen_image import components as C

    assert C.NEGATIVE_PROMPT == " "
    noise = torch.randn(len(PROMPTS), 16, 64, generator=torch.Generator().manual_seed(0))
    lat = {neg: pipe(prompt=list(PROMPTS), negative_prompt=neg, true_cfg_scale=SCALE, height=64, width=64,
                     num_inference_steps=STEPS, latents=noise.clone(), max_sequence_length=SEQ,
                     output_type="latent").images for neg in (" ", "")}
    rel = float((lat[" "] - lat[""]).norm() / lat[" "].norm())
    print(f'negative " " vs "": final latents {rel:.2e} apart (relative L2)')
    assert 1e-3 < rel < 1e-1

def test_cfg_is_one_batched_call_rescaled_with_gradient_through_both_rows(pipe, cond):
    """v = rescale(v_u + s (v_c - v_u)) to |v_c| per token (the pipeline's true CFG) from one call on
    [cond; uncond] rows; not the plain combination; the update's gradient flows through both rows."""
    from fastvideo.models.base import TensorConditioning
    from fastvideo.models.qwen_image.family import QwenImageFamily

    family, plain = QwenImageFamily(guidance_scale=SCALE), QwenImageFamily(guidance_scale=1.0)
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
    comb = v_u + SCALE * (v_c - v_u)
    expected = comb * (v_c.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(v, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(v, comb, atol=1e-2)
    (g,) = torch.autograd.grad(v.sum(), x)
    (g_e,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(g, g_e, rtol=1e-4, atol=1e-5)


def _meta_as_real(inputs: dict) -> dict:
    g = torch.Generator().manual_seed(0)
    return {k: (torch.randn(v.shape, generator=g) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


@pytest.mark.parametrize("text_tokens", [19, 40])
def test_transformer_flops_match_flop_counter(pipe, text_tokens):
    """The analytic count equals FlopCounterMode's on the tiny transformer, forward and backward;
    guidance doubles it."""
    from fastvideo.models.qwen_image import flops as F
    from fastvideo.models.qwen_image.family import QwenImageFamily
    from fastvideo.perf.flops import count_flops

    model = pipe.transformer
    family, config = QwenImageFamily(guidance_scale=1.0), dict(pipe.transformer.config)
    layout = family.nominal_layout(64, 64, config)
    inputs = _meta_as_real(family.meta_inputs(config, 2, layout, text_tokens, torch.float32))
    with torch.no_grad():
        fwd = count_flops(lambda: model(**inputs))
    fb = count_flops(lambda: model(**inputs)[0].square().mean().backward())
    model.zero_grad(set_to_none=True)
    counts = family.transformer_flops(config, 16, text_tokens, 2)
    assert (counts["forward"], counts["forward"] + counts["backward"]) == (fwd, fb)
    d = F.QwenImageDims.from_config(config)
    assert counts["blocks"] == 2 * F.block_flops(d, 16, text_tokens, 2)
    assert QwenImageFamily(guidance_scale=SCALE).transformer_flops(config, 16, text_tokens, 2)["forward"] == 2 * fwd


def test_real_qwen_image_size():
    """The cost model's Qwen-Image shape, built on the meta device by diffusers from its config: 20.4e9
    transformer parameters (the "20B")."""
    from diffusers import QwenImageTransformer2DModel

    from fastvideo.models.qwen_image import flops as F

    with torch.device("meta"):
        model = QwenImageTransformer2DModel.from_config(F.reference_config(F.QWEN_IMAGE_20B))
    count = sum(p.numel() for p in model.parameters())
    assert 20.0e9 < count < 20.6e9, count


def test_bad_inputs_fail_with_one_line(tiny_qwen_image_dir, zimage_embeddings, tmp_path, cond):
    from fastvideo.data.dataset import PromptEmbeddingDataset
    from fastvideo.models.base import EmbeddingDatasetError, EmbeddingShapeError
    from fastvideo.models.qwen_image import components as C
    from fastvideo.models.qwen_image.family import QwenImageFamily

    family = QwenImageFamily(guidance_scale=SCALE)
    # a Z-Image embeddings folder (also masked, also with a negative prompt) trained as Qwen-Image: named
    with pytest.raises(EmbeddingDatasetError, match=r"written for model family 'zimage'.* --model_family qwen_image"):
        PromptEmbeddingDataset(zimage_embeddings, family=family)
    broken = shutil.copytree(tiny_qwen_image_dir, tmp_path / "broken")
    shutil.rmtree(broken / "text_encoder")
    with pytest.raises(C.QwenImageFolderError, match=r"missing: text_encoder/\. Put a diffusers-layout Qwen-Image"):
        family.check_folder(broken, family.text_components)
    with pytest.raises(C.QwenImageFolderError, match="text_encoder/"):
        family.load_text_encoders(broken)
    rec = cond.record(0)
    _, dims = family.check_record(0, rec)
    with pytest.raises(EmbeddingShapeError, match="negative"):
        family.check_record(0, {**rec, "neg_prompt_mask": rec["neg_prompt_mask"][:-1]})
    with pytest.raises(EmbeddingShapeError, match="prompt_embeds_mask"):
        family.check_record(0, {**rec, "prompt_mask": rec["prompt_mask"][:-1]})
    config = json.loads((tiny_qwen_image_dir / "transformer" / "config.json").read_text())
    family.check_dims(dims, config, SEQ)
    with pytest.raises(EmbeddingShapeError, match="Qwen2.5-VL-7B"):
        family.check_dims((SEQ, 2 * dims[1]), config)


def test_compiled_blocks_equal_eager(tiny_qwen_image_dir, cond):
    """--compile's regional compilation of QwenImageTransformerBlock (aot_eager; fullgraph, so a graph
    break fails): the guided velocity and its gradient equal the eager model's."""
    import torch._dynamo as dynamo

    from fastvideo.models.compile import compile_blocks
    from fastvideo.models.qwen_image.family import QwenImageFamily

    dynamo.reset()
    family = QwenImageFamily(guidance_scale=SCALE)
    eager = family.load_transformer(tiny_qwen_image_dir, "transformer", "cpu", torch.float32)
    compiled = family.load_transformer(tiny_qwen_image_dir, "transformer", "cpu", torch.float32)
    assert compile_blocks(compiled, family.block_classes(), "aot_eager") == {"QwenImageTransformerBlock": 2}
    layout = family.nominal_layout(64, 64, dict(eager.config))
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(0))
    out = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        v = family.velocity(model, x, 0.6, cond, layout)
        v.square().mean().backward()
        # the last block's text output is unused: its to_add_out and txt_mlp get no gradient (eager:
        # None, compiled: zeros), its text queries (add_q_proj, norm_added_q) a zero one
        out[name] = (v.detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                  for p in model.parameters()])
    torch.testing.assert_close(out["compiled"][0], out["eager"][0], rtol=1e-5, atol=1e-6)
    assert sum(float(g.abs().sum()) == 0 for g in out["eager"][1]) == 4 + 1 + 4
    for a, b in zip(out["compiled"][1], out["eager"][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_npu_adapter_computes_the_stock_velocity_without_complex_numbers(tiny_qwen_image_dir, cond):
    """The Qwen-Image NPU adapter (every RMS norm fused, RoPE tables made on the CPU and applied in real
    arithmetic, the attention through attention_bnsd) run on the CPU: the guided velocity of prompts of
    unequal length (a masked attention) equals the stock model's, and its forward issues no complex or
    float64 op."""
    import sys
    from pathlib import Path

    from fastvideo.models import npu_ops
    from fastvideo.models.qwen_image.family import QwenImageFamily
    from fastvideo.models.qwen_image.npu import NpuQwenRope, adapt_qwen_image_for_npu

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from float64_guard import NoFloat64OnDevice

    family = QwenImageFamily(guidance_scale=SCALE)
    stock = family.load_transformer(tiny_qwen_image_dir, "transformer", "cpu", torch.float32)
    adapted = family.load_transformer(tiny_qwen_image_dir, "transformer", "cpu", torch.float32)
    assert npu_ops.adapt_for_npu(adapted) == 4 * 2 + 1  # q/k norms of both streams per block, the text norm
    assert adapt_qwen_image_for_npu(adapted) == 2 and adapt_qwen_image_for_npu(adapted) == 0
    layout = family.nominal_layout(64, 64, dict(stock.config))
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = family.velocity(stock, x, 0.6, cond, layout)
        with NoFloat64OnDevice(cpu_only=[NpuQwenRope.forward]) as guard:  # the tables: made on the CPU
            ours = family.velocity(adapted, x, 0.6, cond, layout)
    assert guard.ops > 100
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("checkpointing, verdict", [("--gradient_checkpointing", "fits in 64 GB, with 28.1 GB to spare"),
                                                    ("--no-gradient_checkpointing", "does not fit in 64 GB, by 56.2 GB")])
def test_cost_model_memory_verdict_of_the_16_die_launcher(checkpointing, verdict, capsys):
    """The A3 launcher's shape (16 dies, 3 prompts per rank, micro-batches of 2, CLIP + PickScore) on the
    real Qwen-Image: docs/qwen_image.md's verdicts (the 512-token text is the stored maximum)."""
    from fastvideo.tools.cost_model import main

    main(["--memory", "--model_family", "qwen_image", "--h", "384", "--w", "384", "--sampling_steps", "10",
          "--num_generations", "16", "--sde_steps", "1", "--text_tokens", "512", "--rollout_batch_size", "8",
          "--train_micro_batch_size", "2", "--rewards", "clip:1.0,pickscore:0.5", "--prompts_per_rank", "3",
          "--world_size", "16", "--gradient_accumulation_steps", "12", "--device_memory_gb", "64",
          "--mixed_precision", "bf16", checkpointing])
    out = capsys.readouterr().out
    assert "Qwen-Image (20B)" in out and verdict in out
