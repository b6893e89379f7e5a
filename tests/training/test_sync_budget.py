"""The host-sync budget of one training iteration (fastvideo.perf.syncs): none inside the rollout's
or the update's per-step loop, a small fixed number per iteration, listed by site."""

from __future__ import annotations

import pytest
import torch

from helpers import single_process_trainer, train_args
from fastvideo.perf.syncs import COPY_KINDS, STEP_PHASES, SyncCounter

# Syncs one iteration of the tiny run below may make outside its step loops (all of them listed in
# docs/performance.md): reward metrics, the sampler, the rollout's id checks, the update's
# read-backs, one skip decision per optimizer step. A new one makes this test fail: remove it, or
# move it out of the loops and raise the budget with a reason.
# 36 since the non-finite-reward checks (rewards kept/dropped: combine, finite_group_advantages,
# reward_metrics' finite means), once per iteration each.
ITERATION_BUDGET = 36


@pytest.fixture(scope="module")
def counted(tiny_flux_dir, tiny_embeddings, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    out = tmp_path_factory.mktemp("sync_budget")
    trainer = single_process_trainer(train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=1,
                                                save_images_every=0, train_micro_batch_size=1), mp)
    with SyncCounter() as counter:
        record = trainer.run_iteration()
    mp.undo()
    return counter, record


def test_no_sync_in_the_step_loops(counted):
    counter, _ = counted
    phases = counter.by_phase()
    assert all(phases[p] == 0 for p in STEP_PHASES), counter.report()
    # no host-to-device copy in the update loop either: the terms' rows and steps (22 copies in this
    # run's 2 terms before) are copied once, before it (index_copies; issue #37 item 4)
    assert counter.by_phase(COPY_KINDS)["update_step"] == 0, counter.report()
    copies = counter.sites("update", COPY_KINDS)  # index_copies -> devices.to_device, the update's one copy
    assert sum(n for (_, _, site), n in copies.items() if "devices.py" in site) == 1, counter.report()


def test_iteration_budget(counted):
    counter, record = counted
    per_step = counter.sites("optimizer_step")
    # one read-back per optimizer step: the all-ranks skip decision
    assert sum(per_step.values()) == record["optimizer_steps"] == 2, counter.report()
    assert counter.total() <= ITERATION_BUDGET, counter.report()
    print(counter.report())


class _ToyFamily:
    """velocity(x) = -x: enough for the solvers' step loops."""

    def velocity(self, transformer, x, sigma, cond, layout):
        return -x


@pytest.mark.parametrize("make_plan", ["flow", "dpm_post", "dpm_all"])
def test_solver_step_loops_have_no_sync(make_plan):
    from fastvideo.sampling.plan import SDE, full_sde_plan, window_plan
    from fastvideo.sampling.rollout import sample_transitions

    n = 6
    plan = {"flow": lambda: full_sde_plan(n, 3.0, n - 1, 2, sde_kind="flow"),
            "dpm_post": lambda: window_plan(n, 3.0, 1, 2, candidates=n - 1, dpm_post_ratio=0.8, dpm_order=3),
            "dpm_all": lambda: window_plan(n, 3.0, 1, 2, candidates=n - 1, dpm_all=True,
                                           sde_kind="sde-dpmsolver++")}[make_plan]()
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(2, 4, 8, generator=g)
    eps = {k: torch.randn(2, 4, 8, generator=g) for k, kind in enumerate(plan.kinds) if kind == SDE}
    with SyncCounter() as counter:
        lat, logp, _ = sample_transitions(_ToyFamily(), None, noise, eps, plan, plan.sigmas, None, None, 0.7)
    assert lat.shape[1] == plan.num_steps + 1 and torch.isfinite(lat).all()
    assert counter.by_phase()["rollout_step"] == 0, counter.report()


class _SyncingFamily(_ToyFamily):
    def velocity(self, transformer, x, sigma, cond, layout):
        float(x.abs().max())  # a read-back in the step loop
        return -x


def test_a_sync_in_the_step_loop_is_seen():
    from fastvideo.sampling.plan import full_sde_plan
    from fastvideo.sampling.rollout import sample_transitions

    plan = full_sde_plan(3, 3.0, 2, 1)
    noise = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
    with SyncCounter() as counter:
        sample_transitions(_SyncingFamily(), None, noise, {k: noise for k in range(3)}, plan, plan.sigmas,
                           None, None, 0.7)
    assert counter.counts()[("rollout_step", "item")] == 3, counter.report()
    assert counter.by_phase()["rollout_chunk"] == 0


def test_counter_kinds_and_phases():
    from fastvideo.perf import syncs

    t = torch.arange(6.0)
    with SyncCounter() as counter:
        float(t[1]), t.tolist(), t[t > 2], torch.nonzero(t), torch.unique(t), repr(t)
    kinds = {kind for (_, kind) in counter.counts(syncs.SYNC_KINDS + COPY_KINDS)}
    assert {"item", "tolist", "mask_index", "nonzero", "unique", "print"} <= kinds, counter.report()
    assert counter.counts()[("iteration", "print")] == 1  # repr's own item() calls are not counted again
    assert counter.total() == 6, counter.report()
