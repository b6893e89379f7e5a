"""The SD3 / SD3.5 family against diffusers' own StableDiffusion3Pipeline (nobody here wrote it):
prompt encoding, the ODE rollout with classifier-free guidance, the Flow-GRPO SDE's
log-probability, decoding, FLOPs against FlopCounterMode; and the tiny builder's layout."""

from __future__ import annotations

import json

import pytest
import torch

from fastvideo.models.registry import get_model_family
from fastvideo.models.sd3 import components as C
from fastvideo.models.sd3.family import SD3Family
from fastvideo.sampling.plan import ode_plan
from fastvideo.sampling.randomness import RandomSource
from fastvideo.sampling.rollout import RolloutConfig, rollout

PROMPTS = ["a red cube on a table", "two small birds"]
SEQ = 16  # T5 tokens
STEPS, SHIFT, SCALE = 4, 3.0, 4.5


@pytest.fixture(scope="module")
def pipe(tiny_sd3_dir):
    from diffusers import StableDiffusion3Pipeline

    p = StableDiffusion3Pipeline.from_pretrained(tiny_sd3_dir)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture(scope="module")
def cond(tiny_sd3_dir):
    family = SD3Family()
    return family.encode_prompts(family.load_text_encoders(tiny_sd3_dir), PROMPTS, SEQ)


def test_tiny_folder_has_the_sd35_layout(tiny_sd3_dir, pipe):
    index = json.loads((tiny_sd3_dir / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusion3Pipeline"
    config = pipe.transformer.config
    assert config.qk_norm == "rms_norm" and list(config.dual_attention_layers) == [0]
    assert type(pipe.text_encoder).__name__ == type(pipe.text_encoder_2).__name__ == "CLIPTextModelWithProjection"
    assert pipe.vae.config.shift_factor == 0.1159 and pipe.vae.config.scaling_factor == 0.3611  # make_tiny_sd3 TINY_VAE_*
    SD3Family().check_folder(tiny_sd3_dir)
    assert get_model_family("sd3").name == "sd3"


def test_prompt_encoding_equals_the_pipeline(pipe, cond):
    ref = pipe.encode_prompt(PROMPTS, None, None, do_classifier_free_guidance=True, negative_prompt="",
                             max_sequence_length=SEQ)
    embeds, neg_embeds, pooled, neg_pooled = ref
    assert cond["prompt_embeds"].shape == (2, 77 + SEQ, pipe.transformer.config.joint_attention_dim)
    assert cond["pooled"].shape == (2, pipe.transformer.config.pooled_projection_dim)
    torch.testing.assert_close(cond["prompt_embeds"], embeds, rtol=0, atol=1e-6)
    torch.testing.assert_close(cond["pooled"], pooled, rtol=0, atol=1e-6)
    torch.testing.assert_close(cond["neg_prompt_embeds"], neg_embeds[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(cond["neg_pooled"], neg_pooled[1], rtol=0, atol=1e-6)


def _rollout_cfg(**kw):
    base = dict(height=64, width=64, sampling_steps=STEPS, eta=0.0, shift=SHIFT, num_generations=1,
                rollout_batch_size=2, init_same_noise=False)
    return RolloutConfig(**{**base, **kw})


@pytest.mark.parametrize("scale", [SCALE, 1.0])
def test_ode_rollout_with_cfg_equals_the_pipeline(pipe, cond, scale):
    """The ODE plan's final latents equal StableDiffusion3Pipeline's (output_type latent) for the
    same noise, with CFG at Flow-GRPO's 4.5 and without it (scale 1: one pass). Tolerance 1e-5:
    the same fp32 ops, but our schedule is computed in torch and the pipeline's in numpy."""
    family = SD3Family(guidance_scale=scale)
    plan = ode_plan(STEPS, SHIFT)
    traj = rollout(family, pipe.transformer, pipe.vae, cond, PROMPTS, [0, 1], _rollout_cfg(), RandomSource(3), 1,
                   "cpu", plan=plan)
    lat_h, lat_w = traj.layout.latent_hw
    noise = C.to_grid(traj.latents[:, 0], lat_h, lat_w)
    unshifted = torch.linspace(1.0, 0.0, STEPS + 1)[:-1].tolist()  # the scheduler shifts them itself
    ref = pipe(PROMPTS, height=64, width=64, sigmas=unshifted, guidance_scale=scale, latents=noise.clone(),
               max_sequence_length=SEQ, output_type="latent").images
    ours = C.to_grid(traj.latents[:, -1], lat_h, lat_w)
    assert ours.abs().max() > 0.1 and not torch.allclose(ours, noise, atol=1e-2)  # it moved
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plan.sigmas[:-1], pipe.scheduler.sigmas[:-1], rtol=0, atol=1e-6)
    # images: the family decodes the x0 prediction with SD3's shift / scale, as the pipeline's "pil" path
    x0 = C.to_grid(traj.x0, lat_h, lat_w)
    ref_img = pipe.vae.decode(x0 / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor).sample
    torch.testing.assert_close(traj.images, (ref_img / 2 + 0.5).clamp(0, 1), rtol=0, atol=1e-5)


def test_cfg_runs_one_batched_pass_and_counts_two(pipe, cond):
    calls = []
    handle = pipe.transformer.register_forward_hook(lambda m, a, kw_out=None: calls.append(1))
    try:
        family = SD3Family(guidance_scale=SCALE)
        layout = family.layout(64, 64, pipe.vae, pipe.transformer)
        x = torch.randn(2, *layout.tokens)
        with torch.no_grad():
            v = family.velocity(pipe.transformer, x, 0.7, cond, layout)
            v_u = SD3Family(1.0).velocity(pipe.transformer, x, 0.7, _uncond(cond), layout)
            v_c = SD3Family(1.0).velocity(pipe.transformer, x, 0.7, cond, layout)
    finally:
        handle.remove()
    assert len(calls) == 3  # one batched call for the guided velocity, one each for v_u and v_c
    torch.testing.assert_close(v, v_u + SCALE * (v_c - v_u), rtol=1e-5, atol=1e-5)
    assert (family.velocity_passes, SD3Family(1.0).velocity_passes) == (2, 1)


def _uncond(cond):
    from fastvideo.models.base import TensorConditioning

    b = len(cond)
    return TensorConditioning({"prompt_embeds": cond["neg_prompt_embeds"].expand(b, -1, -1),
                               "pooled": cond["neg_pooled"].expand(b, -1)}, dict(cond.shared))


def test_flow_sde_log_prob_equals_torch_normal_with_flow_grpos_mean_and_std(pipe, cond):
    """Flow-GRPO's sd3_sde_with_logprob: std_dev_t = sqrt(sigma / (1 - sigma)) * eta,
    mean = x (1 + std_dev_t^2 / (2 sigma) dt) + v (1 + std_dev_t^2 (1 - sigma) / (2 sigma)) dt,
    std = std_dev_t sqrt(-dt); its log-prob is Normal(mean, std).log_prob averaged over elements."""
    from fastvideo.sampling.rollout import sde_transition

    family = SD3Family(guidance_scale=SCALE)
    layout = family.layout(64, 64, pipe.vae, pipe.transformer)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *layout.tokens, generator=g)
    eps = torch.randn(2, *layout.tokens, generator=g)
    sigma, sigma_next, eta = 0.8, 0.6, 0.7
    with torch.no_grad():
        v = family.velocity(pipe.transformer, x, sigma, cond, layout)
    sample, logp = sde_transition("flow", x, v, sigma, sigma_next, eta, 0.9, noise=eps)
    std_dev_t = (torch.tensor(sigma) / (1 - torch.tensor(sigma))).sqrt() * eta
    dt = torch.tensor(sigma_next - sigma)
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    std = std_dev_t * (-dt).sqrt()
    ref = torch.distributions.Normal(mean, std).log_prob(sample).mean(dim=(1, 2))
    torch.testing.assert_close(sample, mean + std * eps, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-5)
    # the update re-scores the stored sample: the same log-prob
    _, again = sde_transition("flow", x, v, sigma, sigma_next, eta, 0.9, prev_sample=sample)
    torch.testing.assert_close(again, logp, rtol=0, atol=1e-6)


def test_transformer_flops_match_flop_counter(tiny_sd3_dir):
    from diffusers import SD3Transformer2DModel

    from fastvideo.models.sd3 import flops as F
    from fastvideo.perf.flops import count_flops

    model = SD3Transformer2DModel.from_pretrained(tiny_sd3_dir, subfolder="transformer")
    family = SD3Family(guidance_scale=1.0)
    config = dict(model.config)
    inputs = {k: (torch.randn(v.shape) if isinstance(v, torch.Tensor) else v)
              for k, v in family.meta_inputs(config, 2, family.nominal_layout(64, 64, config), SEQ,
                                             torch.float32).items()}
    with torch.no_grad():
        fwd = count_flops(lambda: model(**inputs))
    fb = count_flops(lambda: model(**inputs)[0].square().mean().backward())
    counts = family.transformer_flops(config, (64 // 16) ** 2, SEQ, 2)
    assert (counts["forward"], counts["forward"] + counts["backward"]) == (fwd, fb)
    assert counts["blocks"] == sum(F.joint_block_flops(F.SD3Dims.from_config(config), i, 16, 77 + SEQ, 2)
                                   for i in range(2))
    guided = SD3Family(guidance_scale=SCALE).transformer_flops(config, 16, SEQ, 2)
    assert guided["forward"] == 2 * fwd  # the unconditional rows are a second batch


def test_bad_embeddings_and_folders_fail_clearly(tiny_sd3_dir, tmp_path, cond):
    from fastvideo.models.base import EmbeddingShapeError

    family = SD3Family()
    rec = cond.record(0)
    family.check_record(0, rec)
    with pytest.raises(EmbeddingShapeError, match="negative"):
        family.check_record(0, {**rec, "neg_pooled": rec["neg_pooled"][:-1]})
    dims = family.check_record(0, rec)[1]
    assert dims == (SEQ, rec["prompt_embeds"].shape[1], rec["pooled"].shape[0])  # dims[0]: the T5 length
    config = json.loads((tiny_sd3_dir / "transformer" / "config.json").read_text())
    family.check_dims(dims, config, SEQ)
    with pytest.raises(EmbeddingShapeError, match="max_sequence_length 8"):
        family.check_dims(dims, config, 8)
    with pytest.raises(EmbeddingShapeError, match="joint_attention_dim"):
        family.check_dims((dims[0], dims[1] + 1, dims[2]), config)
    with pytest.raises(C.SD3FolderError, match="text_encoder_3/"):
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "model_index.json").write_text("{}")
        family.check_folder(tmp_path / "m")
    import shutil  # the shared check (models.base.check_diffusers_folder) names weights and tokenizer files

    broken = shutil.copytree(tiny_sd3_dir, tmp_path / "broken")
    for f in (broken / "text_encoder_3").glob("*.safetensors"):
        f.unlink()
    for f in (broken / "tokenizer_2").iterdir():
        f.unlink()
    with pytest.raises(C.SD3FolderError, match=r"missing: tokenizer_2/<tokenizer files>, "
                                               r"text_encoder_3/<weights \*.safetensors>\. Put a diffusers-layout SD3.5"):
        family.check_folder(broken)


def test_update_gradient_flows_through_the_conditional_rows_only(pipe, cond):
    """Flow-GRPO's compute_log_prob detaches the unconditional prediction: d v / d x = s d v_c / d x."""
    family = SD3Family(guidance_scale=SCALE)
    layout = family.layout(64, 64, pipe.vae, pipe.transformer)
    x = torch.randn(2, *layout.tokens, generator=torch.Generator().manual_seed(1), requires_grad=True)
    (grad,) = torch.autograd.grad(family.velocity(pipe.transformer, x, 0.5, cond, layout).sum(), x)
    (grad_c,) = torch.autograd.grad(SD3Family(1.0).velocity(pipe.transformer, x, 0.5, cond, layout).sum(), x)
    # batched (guided) and unbatched (v_c) calls round differently: 1e-5 against gradients of ~1
    torch.testing.assert_close(grad, SCALE * grad_c, rtol=1e-4, atol=1e-5)


def test_cost_model_counts_sd35_medium_with_both_guidance_passes(capsys):
    from fastvideo.models.sd3 import flops as F
    from fastvideo.tools import cost_model

    cost_model.main(["--model_family", "sd3", "--h", "512", "--w", "512", "--sampling_steps", "10",
                     "--num_generations", "24", "--prompts_per_rank", "1", "--timestep_fraction", "1.0",
                     "--world_size", "8", "--text_tokens", "128", "--gradient_checkpointing", "--kl_coef", "0.01",
                     "--json"])
    out = json.loads(capsys.readouterr().out)
    one_pass = F.transformer_flops_breakdown(F.SD35_MEDIUM, 32 * 32, 77 + 128)["total"]
    assert out["flops"]["rollout"] == 10 * 8 * 24 * 2 * one_pass  # steps x samples x (cond + uncond)
    assert out["trained_steps"] == 9
    # Flow-GRPO's train.beta: one guided reference velocity (2 passes, no grad) per trained step
    assert out["flops"]["update_nograd"] == out["flops"]["update_forward"] == 9 * 8 * 24 * 2 * one_pass


@pytest.mark.slow  # traces SD3.5-M's forward and backward on the meta device: ~16 s of CPU
def test_cost_model_memory_verdict_for_sd35_medium_on_64gb_dies(capsys):
    """The launchers' shape on 16 dies (full fine-tuning: LoRA's memory is below it): SD3.5-M's
    parameters as diffusers builds them from its config, sharded 16 ways in fp32, and a verdict."""
    from diffusers import SD3Transformer2DModel

    from fastvideo.tools import cost_model

    cost_model.main(["--memory", "--model_family", "sd3", "--h", "512", "--w", "512", "--sampling_steps", "10",
                     "--num_generations", "24", "--world_size", "16", "--rollout_batch_size", "8",
                     "--train_micro_batch_size", "4", "--gradient_accumulation_steps", "3", "--timestep_fraction",
                     "1.0", "--text_tokens", "128", "--gradient_checkpointing", "--rewards", "pickscore:1.0",
                     "--device", "npu", "--device_memory_gb", "64", "--json"])
    out = json.loads(capsys.readouterr().out)
    with torch.device("meta"):
        model = SD3Transformer2DModel.from_config(SD3Family().reference_config)
    params = sum(p.numel() for p in model.parameters())
    assert 2.2e9 < params < 2.3e9  # SD3.5-Medium's MMDiT-X (the 2.5B of its name counts the text side too)
    assert out["model"] == "SD3.5-Medium" and out["components"]["parameters"] == params * 4 // 16
    assert out["components"]["adamw_states"] == 2 * out["components"]["parameters"]
    assert out["peak_bytes"] < 64e9 and out["verdict"].startswith("fits in 64 GB"), out["verdict"]
