"""--sigma_grid (the rollout's noise levels) and --decode_from (what is decoded and rewarded).

The reference for the `diffusers` grid is the installed diffusers' FlowMatchEulerDiscreteScheduler
(stock), which Flow-GRPO's and DiffusionNFT's SD3 pipelines call through retrieve_timesteps with no
sigmas. The reference for `final_sample` is Flow-GRPO's pipeline loop (sd3_pipeline_with_logprob.py:
the VAE decodes `latents` after the last sde_step_with_logprob), written out below on the
scheduler's own sigmas.
"""

from __future__ import annotations

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from fastvideo.config import ConfigError, build_parser, validate_args
from fastvideo.models.flux import predict_velocity
from fastvideo.sampling import sde, solvers
from fastvideo.sampling.plan import full_sde_plan, on_grid, window_plan
from fastvideo.sampling.randomness import RandomSource
from fastvideo.sampling.rollout import RolloutConfig
from sampling_helpers import flux_rollout as rollout
from sampling_helpers import tiny_models

PROMPTS = ["a red cube", "a blue ball"]
BASE = ["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility"]


@pytest.mark.parametrize("shift", [3.0, 1.0, 2.5, 5.0])
@pytest.mark.parametrize("steps", [1, 2, 10, 16, 40])
def test_diffusers_grid_is_the_schedulers_bit_for_bit(shift, steps):
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    assert torch.equal(sde.grid_sigmas("diffusers", steps, shift), scheduler.sigmas)
    assert torch.equal(sde.grid_sigmas("shifted_linspace", steps, shift), sde.sigma_schedule(steps, shift))


def test_the_two_grids_differ_where_the_issue_says():
    """10 steps at shift 3: the shifted linspace stops at 0.25 before 0, the scheduler's at 0.0089."""
    lin, dif = sde.sigma_schedule(10, 3.0), sde.diffusers_sigma_schedule(10, 3.0)
    assert lin[-2].item() == pytest.approx(0.25, abs=1e-6)
    assert dif[-2].item() == pytest.approx(3 * 0.002994 / (1 + 2 * 0.002994), rel=1e-3)  # shift(shift(1/1000))
    assert dif[0] == 1 and dif[-1] == 0 and lin[1] != dif[1]


def test_on_grid_swaps_the_sigmas_and_keeps_the_plan():
    plan = window_plan(10, 3.0, 2, 3, candidates=9, sde_kind="flow")
    assert on_grid(plan, "shifted_linspace", 10, 3.0) is plan  # the default: the plan itself
    moved = on_grid(plan, "diffusers", 10, 3.0)
    assert torch.equal(moved.sigmas, sde.diffusers_sigma_schedule(10, 3.0))
    assert moved.host_sigmas == tuple(moved.sigmas.tolist())  # what the step loops read
    assert (moved.kinds, moved.trainable, moved.num_trained, moved.sde_kind) == \
        (plan.kinds, plan.trainable, plan.num_trained, plan.sde_kind)
    tail = window_plan(10, 3.0, 2, 3, candidates=9, dpm_post_ratio=0.4)
    with pytest.raises(ValueError, match="compressed tail"):
        on_grid(tail, "diffusers", 10, 3.0)


def _validate(*extra):
    return validate_args(build_parser().parse_args(BASE + list(extra)))


def test_flags_reach_the_settings_and_a_compressed_tail_is_refused():
    cfg = _validate("--sigma_grid", "diffusers", "--decode_from", "final_sample")
    assert (cfg.rollout.sigma_grid, cfg.rollout.decode_from) == ("diffusers", "final_sample")
    assert (_validate().rollout.sigma_grid, _validate().rollout.decode_from) == ("shifted_linspace", "x0_prediction")
    with pytest.raises(ConfigError, match="--sigma_grid diffusers"):
        _validate("--sigma_grid", "diffusers", "--sde_steps", "2", "--dpm_algorithm_type", "dpmsolver++",
                  "--dpm_apply_strategy", "post")


def test_a_config_json_without_the_keys_resumes_on_the_old_defaults():
    from fastvideo.sampling.settings import RolloutSettings

    section = _validate("--sigma_grid", "diffusers").to_dict()["rollout"]
    assert RolloutSettings.flags_from_resolved(section)["sigma_grid"] == "diffusers"
    old = {k: v for k, v in section.items() if k not in ("sigma_grid", "decode_from")}
    flags = RolloutSettings.flags_from_resolved(old)
    assert (flags["sigma_grid"], flags["decode_from"]) == ("shifted_linspace", "x0_prediction")


def test_the_grid_is_part_of_the_resume_identity():
    from fastvideo.training.run.identity import identity_differences, run_identity

    now = run_identity(_validate("--sigma_grid", "diffusers"), 1)
    before = {k: v for k, v in run_identity(_validate(), 1).items() if k != "sigma_grid"}  # an older checkpoint
    assert identity_differences(before, now) == [
        "sigma_grid (--sigma_grid): checkpoint 'shifted_linspace', this run 'diffusers'"]


@pytest.fixture(scope="module")
def models(tiny_flux_dir):
    return tiny_models(tiny_flux_dir, PROMPTS, 16)


@torch.no_grad()
def _flow_grpo_loop(models, steps, eta, iteration, seed):
    """Flow-GRPO's SD3 sampling loop (sd3_pipeline_with_logprob.py at ac4c86e) on the tiny FLUX:
    the scheduler's sigmas, its SDE step at every transition, the final `latents` decoded."""
    transformer, _, embeds, pooled, text_ids = models
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(steps)
    sigmas = scheduler.sigmas
    rs, ids = RandomSource(seed), torch.arange(4)
    shape = (4, transformer.config.in_channels)
    x = rs.initial_noise(iteration, ids, shape)
    e, p = embeds.repeat_interleave(2, 0), pooled.repeat_interleave(2, 0)
    from fastvideo.models import flux

    for k in range(steps):
        v = predict_velocity(transformer, x, sigmas[k], e, p, text_ids, flux.image_ids(4, 4))
        x, _ = solvers.flow_sde_step(x, v, sigmas[k], sigmas[k + 1], eta, float(sigmas[1]),
                                     noise=rs.step_noise(iteration, ids, k, shape))
    return x


@pytest.mark.parametrize("decode_from", ["final_sample", "x0_prediction"])
def test_final_sample_decoding_on_the_diffusers_grid_is_flow_grpos_loop(models, decode_from):
    steps, eta = 4, 0.7
    cfg = RolloutConfig(height=32, width=32, sampling_steps=steps, eta=eta, shift=3.0, num_generations=2,
                        rollout_batch_size=4, init_same_noise=False, decode_from=decode_from)
    plan = on_grid(full_sde_plan(steps, 3.0, steps, 1, sde_kind="flow"), "diffusers", steps, 3.0)
    transformer, vae, embeds, pooled, text_ids = models
    traj = rollout(transformer, vae, embeds, pooled, text_ids, PROMPTS, [0, 1], cfg, RandomSource(5), 3, "cpu",
                   decode=False, plan=plan)
    want = _flow_grpo_loop(models, steps, eta, 3, 5)
    assert torch.equal(traj.latents[:, -1], want)
    if decode_from == "final_sample":
        assert torch.equal(traj.x0, want)
    else:  # the last step's x0 prediction: not the noisy final SDE sample
        assert (traj.x0 - want).abs().max() > 1e-3


def test_the_trainer_and_evaluation_sample_on_the_runs_grid():
    from types import SimpleNamespace

    from fastvideo.eval.core import SampleSettings, eval_plan
    from fastvideo.models.registry import get_model_family
    from fastvideo.training.trainer import Trainer

    cfg = _validate("--sigma_grid", "diffusers", "--sampling_steps", "10")
    trainer = SimpleNamespace(cfg=cfg, objective=SimpleNamespace(
        sampling_plan=lambda it, n, shift: full_sde_plan(n, shift, n - 1, 3)),
        family=get_model_family("flux"))  # no shift_terminal: the grid as it is
    assert torch.equal(Trainer.sampling_plan(trainer, 0).sigmas, sde.diffusers_sigma_schedule(10, 3.0))
    trainer.cfg = _validate("--sampling_steps", "10")
    assert torch.equal(Trainer.sampling_plan(trainer, 0).sigmas, sde.sigma_schedule(10, 3.0))
    s = SampleSettings(height=32, width=32, steps=6, eta=0.0, shift=3.0, batch_size=1, num_images_per_prompt=1,
                       sigma_grid="diffusers")
    assert torch.equal(eval_plan(s).sigmas, sde.diffusers_sigma_schedule(6, 3.0))


def test_the_flag_offers_exactly_the_grids_sde_computes():
    from fastvideo.sampling import settings

    assert settings.SIGMA_GRIDS == sde.SIGMA_GRIDS  # kept apart so that --help imports no torch
