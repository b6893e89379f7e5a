"""The objective protocol: registry, plugins, the GRPO objective's work plan and state."""

from __future__ import annotations

import pytest
import torch

from fastvideo.algorithms.base import ObjectiveContext, RewardResult, StatsAccumulator, Term
from fastvideo.algorithms.registry import build_objective, register_objective, resolve_objective
from fastvideo.distributed.parallel import ParallelDims
from fastvideo.errors import ConfigError


def test_unknown_objective_lists_the_registered_ones():
    with pytest.raises(ConfigError, match="registered: .*grpo"):
        resolve_objective("ppo-typo")


def test_plugin_path_loads_and_registers():
    factory = resolve_objective("fastvideo.algorithms.grpo:GRPOObjective")
    from fastvideo.algorithms.grpo import GRPOObjective

    assert factory is GRPOObjective
    with pytest.raises(ConfigError, match="cannot load 'Nope'"):
        resolve_objective("fastvideo.algorithms.grpo:Nope")


def test_register_objective_makes_a_name_selectable():
    made = []

    def factory(context):
        made.append(context)
        return "built"

    register_objective("test-only", factory)
    ctx = ObjectiveContext(cfg=None, dims=None, device=torch.device("cpu"))
    assert build_objective("test-only", ctx) == "built" and made == [ctx]
    register_objective("test-only", factory)  # the same factory again: nothing changes
    with pytest.raises(ValueError, match="'test-only' is already registered"):
        register_objective("test-only", lambda context: "another")
    with pytest.raises(ValueError, match="'grpo' is already registered .*GRPOObjective"):
        register_objective("grpo", factory)


def test_stats_accumulator_sums_and_keeps_the_first_micro_batch_max():
    acc = StatsAccumulator(torch.device("cpu"))
    acc.add(Term(0, torch.arange(2)), {"a": torch.tensor(1.0)}, {"dev": torch.tensor(0.2)})
    acc.add(Term(0, torch.arange(2)), {"a": torch.tensor(2.0)}, {"dev": torch.tensor(0.5)})
    acc.add(Term(1, torch.arange(2)), {"a": torch.tensor(3.0)}, {"dev": torch.tensor(9.0)})
    assert acc.terms == 3 and acc.mean("a") == pytest.approx(2.0)
    assert float(acc.first_max["dev"]) == pytest.approx(0.5)  # the second micro-batch's 9.0 is not "first"


def test_parallel_dims_from_the_sharding_strategy():
    assert ParallelDims.build(8, 3, "full").describe() == {"world_size": 8, "dp_replicate": 1, "dp_shard": 8, "sp": 1}
    assert ParallelDims.build(8, 3, "none").dp_replicate == 8
    hybrid = ParallelDims.build(16, 5, "hybrid", ranks_per_node=8)
    assert (hybrid.dp_replicate, hybrid.dp_shard, hybrid.dp_size, hybrid.dp_rank) == (2, 8, 16, 5)
    seq = ParallelDims.build(8, 5, "full", sp=2)  # sequence groups of consecutive ranks
    assert (seq.dp_shard, seq.dp_size, seq.dp_rank, seq.sp_rank) == (4, 4, 2, 1)
    with pytest.raises(ConfigError, match="--sp_size 3 does not divide the world size 8"):
        ParallelDims.build(8, 0, "full", sp=3)


class _Cfg:
    """The fields GRPOObjective reads, as TrainConfig has them."""

    def __init__(self, use_group=True, mix=None):
        from types import SimpleNamespace

        from fastvideo.component_settings.update import UpdateSettings
        from fastvideo.config import GRPOSettings

        self.grpo = GRPOSettings(use_group=use_group, adv_std="sample", train_last_step=False, timestep_fraction=0.5,
                                 clip_range=0.2, adv_clip_max=5.0, loss_coef=1.0)
        self.update = UpdateSettings(train_micro_batch_size=3, gradient_accumulation_steps=1)
        self.rollout = SimpleNamespace(num_generations=2, eta=0.5, shift=3.0)
        self.mix = mix


def test_grpo_objective_plans_micro_batches_of_trained_steps():
    from types import SimpleNamespace

    from fastvideo.algorithms.grpo import GRPOObjective
    from fastvideo.sampling.plan import full_sde_plan
    from fastvideo.sampling.randomness import RandomSource

    obj = GRPOObjective(ObjectiveContext(cfg=_Cfg(), dims=ParallelDims.build(1, 0), device=torch.device("cpu"),
                                         randomness=RandomSource(3)))
    plan = full_sde_plan(6, 3.0, 5, 2)
    traj = SimpleNamespace(plan=plan, num_samples=7, sample_ids=torch.arange(7), num_steps=6)
    micro = obj.plan_update(traj, iteration=1)
    assert [len(m) for m in micro] == [2, 2, 2]  # ceil(7 / 3) micro-batches x T = 2 terms
    assert [m[0].rows.tolist() for m in micro] == [[0, 1, 2], [3, 4, 5], [6]]
    perms = RandomSource(3).timestep_permutations(1, torch.arange(7), 5)
    for m in micro:
        for t, term in enumerate(m):
            assert term.micro_batch == micro.index(m)
            assert torch.equal(term.steps, perms[term.rows, t])  # the first T of each sample's permutation
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0])
    adv = obj.advantages(RewardResult(rewards, {}))
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]) / 2 ** 0.5,  # (r - mean) / sample std
                          atol=1e-6)
    assert obj.state_dict() == {}
    with pytest.raises(ConfigError, match="has no state"):
        obj.load_state_dict({"x": 1})
