"""The rollout driven by a SamplingPlan: the all-SDE plan is today's path bit for bit; windows,
Euler ODE and the DPM-Solver++ tail on the tiny FLUX model."""

from __future__ import annotations

import pytest
import torch

from fastvideo.models import flux
from fastvideo.sampling import sde, solvers
from fastvideo.sampling.plan import full_sde_plan, window_plan
from fastvideo.sampling.randomness import RandomSource
from fastvideo.models.flux import predict_velocity
from fastvideo.sampling.rollout import RolloutConfig, sde_transition
from sampling_helpers import flux_rollout as rollout
from sampling_helpers import tiny_models

PROMPTS = ["a red cube", "a blue ball"]
SEQ = 16


@pytest.fixture(scope="module")
def models(tiny_flux_dir):
    return tiny_models(tiny_flux_dir, PROMPTS, SEQ)


def _cfg(steps=6, eta=0.3):
    return RolloutConfig(height=32, width=32, sampling_steps=steps, eta=eta, shift=3.0, num_generations=2,
                         rollout_batch_size=4, init_same_noise=False)


def _run(models, cfg, plan=None, rs=None, iteration=3, keep_latents=True, keep_log_probs=True):
    transformer, vae, embeds, pooled, text_ids = models
    return rollout(transformer, vae, embeds, pooled, text_ids, PROMPTS, [0, 1], cfg, rs or RandomSource(5), iteration,
                   "cpu", decode=False, plan=plan, keep_latents=keep_latents, keep_log_probs=keep_log_probs)


@torch.no_grad()
def _reference_loop(models, cfg, iteration=3, seed=5):
    """The rollout loop as it was before plans (commit 66379f5): every step SDE, x0 at the last."""
    transformer, _, embeds, pooled, text_ids = models
    rs = RandomSource(seed)
    ids = torch.arange(4)
    L, C = 4, transformer.config.in_channels
    x = rs.initial_noise(iteration, ids, (L, C))
    eps = torch.stack([rs.step_noise(iteration, ids, k, (L, C)) for k in range(cfg.sampling_steps)])
    sigmas = sde.sigma_schedule(cfg.sampling_steps, cfg.shift)
    img_ids = flux.image_ids(4, 4)
    e, p = embeds.repeat_interleave(2, 0), pooled.repeat_interleave(2, 0)
    lat, lps = [x], []
    for k in range(cfg.sampling_steps):
        v = predict_velocity(transformer, x, sigmas[k], e, p, text_ids, img_ids)
        if k == cfg.sampling_steps - 1:
            x0 = sde.x0_prediction(x, v, sigmas[k])
        x, lp = sde.sde_step(x, v, sigmas[k], sigmas[k + 1], cfg.eta, noise=eps[k])
        lat.append(x)
        lps.append(lp)
    return torch.stack(lat, 1), torch.stack(lps, 1), x0


def test_all_sde_plan_is_the_pre_plan_path_bit_for_bit(models):
    cfg = _cfg()
    ref_lat, ref_lp, ref_x0 = _reference_loop(models, cfg)
    for plan in (None, full_sde_plan(6, 3.0, 5, 3)):
        traj = _run(models, cfg, plan)
        assert torch.equal(traj.latents, ref_lat) and torch.equal(traj.log_probs, ref_lp)
        assert torch.equal(traj.x0, ref_x0) and torch.equal(traj.sigmas, sde.sigma_schedule(6, 3.0))
    # the update's re-scoring entry point is DanceGRPO's sde_step, called the same way
    x, v, nxt = ref_lat[:, 1], torch.randn_like(ref_lat[:, 1]), ref_lat[:, 2]
    s = sde.sigma_schedule(6, 3.0)
    assert torch.equal(sde_transition("dance", x, v, s[1], s[2], 0.3, None, prev_sample=nxt)[1],
                       sde.sde_step(x, v, s[1], s[2], 0.3, prev_sample=nxt)[1])


def test_window_plan_ode_outside_sde_inside(models, tmp_path):
    transformer, _, embeds, pooled, text_ids = models
    cfg = _cfg()
    plan = window_plan(6, 3.0, 2, 2, candidates=5)
    rs = RandomSource(5).capture(tmp_path)
    traj = _run(models, cfg, plan, rs=rs)
    rs.flush()
    full = _run(models, cfg)
    # before the window: the deterministic Euler ODE from the same initial noise
    assert torch.equal(traj.latents[:, 0], full.latents[:, 0])
    e, p = traj.cond["prompt_embeds"], traj.cond["pooled"]
    for k in range(6):
        x = traj.latents[:, k]
        v = predict_velocity(transformer, x, traj.sigmas[k], e, p, traj.cond["text_ids"], traj.layout["image_ids"])
        if k in (2, 3):
            _, lp = sde.sde_step(x, v, traj.sigmas[k], traj.sigmas[k + 1], 0.3, prev_sample=traj.latents[:, k + 1])
            assert (torch.exp(lp - traj.log_probs[:, k]) - 1).abs().max() < 1e-5
            assert not torch.allclose(traj.latents[:, k + 1], x + (traj.sigmas[k + 1] - traj.sigmas[k]) * v)
        else:
            torch.testing.assert_close(traj.latents[:, k + 1], x + (traj.sigmas[k + 1] - traj.sigmas[k]) * v,
                                       rtol=1e-5, atol=1e-6)
            assert torch.all(traj.log_probs[:, k] == 0)
    # step noise is drawn only for the window's transitions
    from safetensors.torch import load_file
    keys = load_file(str(tmp_path / "randomness_000003.safetensors")).keys()
    assert sorted({int(k.split("/")[-1]) for k in keys if k.startswith("step_noise")}) == [2, 3]
    assert traj.plan is plan and traj.subset([1, 0]).plan is plan


@pytest.mark.parametrize("order", [2, 3])
def test_flash_tail_runs_dpm_solver_pp(models, order):
    transformer, _, embeds, pooled, text_ids = models
    cfg = _cfg(steps=12, eta=0.7)
    plan = window_plan(12, 3.0, 1, 2, candidates=11, dpm_post_ratio=0.5, dpm_solver_type="midpoint",
                       dpm_order=order)
    assert plan.describe() == "OSS" + "D" * 4  # int((12 - 2) * 0.5) = 5 points -> 4 DPM steps
    traj = _run(models, cfg, plan)
    assert traj.latents.shape[1] == 8 and traj.log_probs.shape[1] == 7 and traj.sigmas[-1] == 0
    s, e, p = traj.sigmas.tolist(), traj.cond["prompt_embeds"], traj.cond["pooled"]
    x0 = [sde.x0_prediction(traj.latents[:, k], predict_velocity(transformer, traj.latents[:, k], s[k], e, p,
                                                                  traj.cond["text_ids"], traj.layout["image_ids"]), s[k])
          for k in range(7)]
    # the first DPM step's history is the window's x0s; plan of 7 < 15 transitions: the one
    # before the last is at most second order, the last first order
    orders = {3: min(order, 3), 4: min(order, 3), 5: 2, 6: 1}
    for k in range(3, 7):
        o = orders[k]
        want = solvers.dpm_solver_step(traj.latents[:, k], x0[k - o + 1:k + 1], s[k - o + 1:k + 1], s[k + 1])
        torch.testing.assert_close(traj.latents[:, k + 1], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(traj.latents[:, -1], traj.x0)  # the last DPM step lands on x0
    assert torch.all(traj.log_probs[:, 3:] == 0) and torch.all(traj.log_probs[:, 1:3] != 0)


@pytest.mark.parametrize("dpm", [False, True])
def test_shared_ode_prefix_runs_once_per_group_and_changes_nothing(models, dpm):
    """With init_same_noise a window plan's leading ODE states are the group's: computed once per
    prompt they equal the per-sample computation, and the transformer sees fewer samples."""
    transformer, *_ = models
    # dpm: O O O S D..., order 3: the first DPM step (index 4) needs the outputs of 2 and 3, so only
    # the first 2 ODE steps are shared
    plan = window_plan(8, 3.0, 3, 1 if dpm else 2, candidates=7, dpm_post_ratio=0.6 if dpm else None, dpm_order=3)
    want_prefix = 2 if dpm else 3
    assert plan.shared_prefix() == want_prefix
    seen = []
    handle = transformer.register_forward_pre_hook(
        lambda m, a, kw: seen.append(int(kw["hidden_states"].shape[0])), with_kwargs=True)
    try:
        runs = {}
        for share in (False, True):
            seen.clear()
            cfg = _cfg(steps=8, eta=0.7)
            cfg = RolloutConfig(**{**cfg.__dict__, "init_same_noise": True, "share_ode_prefix": share})
            runs[share] = (_run(models, cfg, plan), sum(seen))
    finally:
        handle.remove()
    (full, n_full), (shared, n_shared) = runs[False], runs[True]
    B, G = full.num_samples, 2
    assert shared.shared_prefix == want_prefix and full.shared_prefix == 0
    assert n_full == B * plan.num_steps and n_shared == n_full - want_prefix * (B - B // G)
    assert shared.rollout_forward_samples() == n_shared
    torch.testing.assert_close(shared.latents, full.latents, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared.log_probs, full.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared.x0, full.x0, rtol=1e-5, atol=1e-5)
    # the prefix states really are the group's: bit-identical across its samples
    head = shared.latents[:, :want_prefix + 1]
    assert torch.equal(head[0::2], head[1::2])
    assert not torch.equal(shared.latents[0::2, -1], shared.latents[1::2, -1])  # the window made them differ


def _lean_case(case: str):
    """(rollout config, plan) of 8 steps: NFT's DPM-Solver++ / AWM's Euler ODE ("nft_dpm", "awm_ode"), or
    an SDE window after a shared ODE prefix ("window_shared_prefix")."""
    from fastvideo.algorithms.nft import deterministic_plan

    cfg = _cfg(steps=8, eta=0.7)
    if case != "window_shared_prefix":
        return cfg, deterministic_plan({"nft_dpm": "dpm", "awm_ode": "ode"}[case], 8, 3.0)
    return RolloutConfig(**{**cfg.__dict__, "init_same_noise": True}), window_plan(8, 3.0, 3, 2, candidates=7)


@pytest.mark.parametrize("case", ["nft_dpm", "window_shared_prefix"])
def test_a_rollout_without_latents_keeps_the_same_samples(models, case):
    """keep_latents=False (Objective.needs_trajectory False: NFT) stores no step latents, and its
    x0 and log-probs are those of the rollout that keeps them, bit for bit (also past a shared
    ODE prefix)."""
    cfg, plan = _lean_case(case)
    kept, lean = (_run(models, cfg, plan, keep_latents=k) for k in (True, False))
    assert kept.latents.shape[:2] == (4, 9) and lean.latents is None
    assert torch.equal(lean.x0, kept.x0) and torch.equal(lean.log_probs, kept.log_probs)
    assert lean.num_samples == 4 and lean.num_steps == 8 and lean.shared_prefix == kept.shared_prefix
    assert torch.equal(lean.subset([3, 0]).x0, kept.x0[[3, 0]])


def test_dpm_all_rollout_and_rescoring(models):
    """--dpm_apply_strategy all: DPM-Solver++ steps (order 2) around an SDE-DPM-Solver++ window
    whose stored transitions re-score to the rollout's log-probs (ratio 1 on policy)."""
    transformer, *_ = models
    algorithm = "dpmsolver++"
    plan = window_plan(6, 3.0, 1, 2, candidates=5, sde_kind="sde-dpmsolver++", dpm_all=True,
                       dpm_solver_type="heun")
    assert plan.describe() == "DSSDDD"
    traj = _run(models, _cfg(eta=0.0), plan)  # eta 0: SDE-DPM steps still draw their noise
    s, e, p = traj.sigmas.tolist(), traj.cond["prompt_embeds"], traj.cond["pooled"]
    out = []
    for k in range(6):
        lat = traj.latents[:, k]
        v = predict_velocity(transformer, lat, s[k], e, p, traj.cond["text_ids"], traj.layout["image_ids"])
        out.append(solvers.dpm_model_output(lat, v, s[k], algorithm))
        if k in (1, 2):
            _, logp = solvers.dpm_sde_step(lat, v, s[k], s[k + 1], prev_sample=traj.latents[:, k + 1])
            torch.testing.assert_close(logp, traj.log_probs[:, k], rtol=1e-5, atol=1e-5)
            mean = solvers.dpm_solver_step(lat, [out[k]], [s[k]], s[k + 1], algorithm)  # ODE part of the mean
            assert (traj.latents[:, k + 1] - mean).abs().mean() > 1e-3  # noise was added
        else:
            o = 1 if k in (0, 5) else 2
            want = solvers.dpm_solver_step(lat, out[k - o + 1:k + 1], s[k - o + 1:k + 1], s[k + 1], algorithm, "heun")
            torch.testing.assert_close(traj.latents[:, k + 1], want, rtol=1e-5, atol=1e-5)
    assert torch.all(traj.log_probs[:, [0, 3, 4, 5]] == 0)


def test_flow_grpo_sde_kind_rescores_to_ratio_one(models):
    transformer, *_ = models
    plan = window_plan(6, 3.0, 0, 3, candidates=5, sde_kind="flow")
    traj = _run(models, _cfg(eta=0.7), plan)
    for k in range(3):
        x = traj.latents[:, k]
        v = predict_velocity(transformer, x, traj.sigmas[k], traj.cond["prompt_embeds"], traj.cond["pooled"], traj.cond["text_ids"],
                             traj.layout["image_ids"])
        _, lp = solvers.flow_sde_step(x, v, traj.sigmas[k], traj.sigmas[k + 1], 0.7, float(traj.sigmas[1]),
                                      prev_sample=traj.latents[:, k + 1])
        assert (torch.exp(lp - traj.log_probs[:, k]) - 1).abs().max() < 1e-5


@pytest.mark.parametrize("case", ["awm_ode", "window_shared_prefix"])
def test_a_rollout_without_log_probs_saves_their_bytes_and_the_memory_model_counts_them(models, tiny_flux_dir, case):
    """keep_log_probs=False (Objective.needs_log_probs False: NFT, AWM, DGPO) stores no log-probability:
    the same samples bit for bit, the trajectory's counted bytes (Trajectory.nbytes, the trainer's
    trajectory_bytes metric) less by exactly the [B, N] float32 log-probs; GRPO's rollout against AWM's
    (no latents, no log-probs) differs by the step latents and the log-probs, exactly as the memory
    model's trajectory_bytes (perf.memory, keeps_latents / keeps_log_probs) says."""
    import json
    from dataclasses import replace

    from fastvideo.algorithms.awm.objective import AWMObjective
    from fastvideo.algorithms.grpo import GRPOObjective
    from fastvideo.perf.memory import MemoryShape, trajectory_bytes

    cfg, plan = _lean_case(case)
    runs = {name: _run(models, cfg, plan, keep_latents=obj.needs_trajectory, keep_log_probs=obj.needs_log_probs)
            for name, obj in (("grpo", GRPOObjective), ("awm", AWMObjective))}
    runs["no_log_probs"] = _run(models, cfg, plan, keep_log_probs=False)
    grpo, awm, lean = runs["grpo"], runs["awm"], runs["no_log_probs"]
    assert awm.log_probs is None and lean.log_probs is None and awm.latents is None
    assert torch.equal(lean.x0, grpo.x0) and torch.equal(awm.x0, grpo.x0) and torch.equal(lean.latents, grpo.latents)
    assert lean.num_steps == awm.num_steps == 8 and awm.subset([3, 0]).log_probs is None
    B, N = grpo.num_samples, 8
    counted = {name: traj.nbytes() for name, traj in runs.items()}
    assert counted["grpo"]["log_probs"] == B * N * 4 and counted["awm"]["log_probs"] == 0
    assert sum(counted["grpo"].values()) - sum(counted["no_log_probs"].values()) == B * N * 4
    saved = sum(counted["grpo"].values()) - sum(counted["awm"].values())
    assert saved == B * (N + 1) * grpo.x0[0].numel() * 4 + B * N * 4
    # the memory model prices the same saving (its other terms, e.g. the prompt embeddings, cancel)
    config = json.loads((tiny_flux_dir / "transformer" / "config.json").read_text())
    shape = MemoryShape(height=32, width=32, text_tokens=SEQ, sampling_steps=N, samples_per_rank=B, rollout_batch=4,
                        micro_batch=1, world_size=1)
    modelled = {keep: trajectory_bytes(config, replace(shape, keeps_latents=keep, keeps_log_probs=keep),
                                       flux.FluxFamily()) for keep in (True, False)}
    assert modelled[True] - modelled[False] == saved
    assert modelled[True] - trajectory_bytes(config, replace(shape, keeps_log_probs=False), flux.FluxFamily()) == B * N * 4
