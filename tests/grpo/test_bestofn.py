"""--bestofn K (best-of-n group sampling): the rows kept equal DanceGRPO's selection, and the flag's
rules. Upstream's facts: tests/fixtures/upstream_bestofn.json (DanceGRPO 15cc71d,
fastvideo/train_grpo_hunyuan.py, run on fixed rewards)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fastvideo.config import build_parser, validate_args
from fastvideo.errors import ConfigError
from fastvideo.grpo.advantages import group_advantages
from fastvideo.grpo.bestofn import best_of_n_rows

FACTS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "upstream_bestofn.json").read_text())


@pytest.mark.parametrize("case", FACTS["cases"], ids=lambda c: f"G{c['num_generations']}K{c['bestofn']}")
def test_kept_rows_are_dancegrpos(case):
    G, K = case["num_generations"], case["bestofn"]
    rewards = torch.tensor(case["vq_rewards"])
    adv = group_advantages(rewards, G, clip_max=5.0)  # GRPO's, upstream's formula (sample std + 1e-8)
    assert torch.allclose(adv, torch.tensor(case["vq_advantages"]), atol=1e-5)
    assert best_of_n_rows(adv, G, K).tolist() == case["kept_rows"]
    # two prompts' groups on one rank: each group's own rows, the second offset by G
    two = best_of_n_rows(torch.cat([adv, adv.flip(0)]), G, K).tolist()
    assert two[:K] == case["kept_rows"] and two[K:] == sorted(2 * G - 1 - r for r in case["kept_rows"])


def test_selection_keeps_both_ends_and_refuses_bad_sizes():
    scores = torch.tensor([0.0, 5.0, -3.0, 1.0, 1.0, 9.0])
    assert best_of_n_rows(scores, 6, 2).tolist() == [2, 5]
    assert best_of_n_rows(scores, 6, 4).tolist() == [0, 1, 2, 5]
    assert best_of_n_rows(scores, 6, 6).tolist() == list(range(6))
    assert best_of_n_rows(torch.zeros(4), 4, 2).tolist() == [0, 3]  # ties: stable order
    for keep in (0, 3, 8):
        with pytest.raises(ValueError, match="best-of-n"):
            best_of_n_rows(scores, 6, keep)


def _cfg(*flags):
    argv = ["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility:1",
            "--train_micro_batch_size", "2", *flags]
    return validate_args(build_parser(argv).parse_args(argv))


def test_the_flag_counts_the_trained_samples_and_refuses_what_does_not_fit():
    cfg = _cfg("--use_group", "--num_generations", "8", "--bestofn", "4", "--train_batch_size", "2")
    assert cfg.rollout.trained_per_prompt == 4 and cfg.rollout.num_generations == 8
    d = cfg.derived(2)
    assert (d["samples_per_rank"], d["micro_batches_per_rank"]) == (16, 4)  # 2 prompts x 4 trained / 2
    all_trained = _cfg("--use_group", "--num_generations", "8", "--train_batch_size", "2")
    assert all_trained.derived(2)["micro_batches_per_rank"] == 8
    assert _cfg("--use_group", "--num_generations", "8").rollout.bestofn == 0  # off by default
    for flags in (("--use_group", "--num_generations", "8", "--bestofn", "3"),   # odd
                  ("--use_group", "--num_generations", "8", "--bestofn", "10"),  # more than the group
                  ("--num_generations", "8", "--bestofn", "4"),                  # no groups: one sample a prompt
                  ("--use_group", "--num_generations", "8", "--bestofn", "-2")):
        with pytest.raises(ConfigError, match=r"--bestofn -?\d+: .*even K from 2 to --num_generations"):
            _cfg(*flags)
    # DGPO's whole-group micro-batches count the trained group
    with pytest.raises(ConfigError, match="a multiple of --bestofn 4"):
        _cfg("--algorithm", "dgpo", "--use_group", "--num_generations", "8", "--bestofn", "4",
             "--train_micro_batch_size", "2")
    assert _cfg("--algorithm", "dgpo", "--use_group", "--num_generations", "8", "--bestofn", "4",
                "--train_micro_batch_size", "4").rollout.trained_per_prompt == 4


def test_grpo_reindexes_its_per_sample_state_to_the_kept_rows():
    """GRPO's mask of dropped samples and its last advantages follow the rows the update gets."""
    from fastvideo.algorithms.grpo import GRPOObjective

    obj = GRPOObjective.__new__(GRPOObjective)
    obj._kept = torch.tensor([True, False, True, True])
    obj._last_advantages = torch.tensor([0.5, 0.0, -1.0, 2.0])
    obj.keep_samples(torch.tensor([1, 3]))
    assert obj._kept.tolist() == [False, True] and obj._last_advantages.tolist() == [0.0, 2.0]
    assert obj.kept_rows(torch.tensor([0, 1])).tolist() == [False, True]


def test_the_cost_model_counts_the_trained_samples():
    """FLOPs and FSDP traffic of the update scale with the trained samples; the rollout, decode and the
    trajectory held (memory) stay at all G; the trainer's memory shape says the trained count."""
    from fastvideo.perf.comms import CommShape, update_terms
    from fastvideo.perf.flops import IterationShape, iteration_flops
    from fastvideo.training.lean import memory_shape

    base = dict(height=256, width=256, num_generations=24, prompts_per_rank=2, world_size=4, trained_steps=3)
    full, best = (iteration_flops(IterationShape(**base, bestofn=k)) for k in (0, 8))
    assert best.rollout == full.rollout and best.vae_decode == full.vae_decode
    assert best.update_forward * 3 == full.update_forward and best.update_backward * 3 == full.update_backward
    with pytest.raises(ValueError, match="bestofn"):
        IterationShape(**base, bestofn=5)
    comm = dict(params=10, samples_per_rank=48, rollout_batch=4, micro_batch=2, sampling_steps=8, trained_steps=3,
                shards=4)
    assert update_terms(CommShape(**comm, trained_per_rank=16)) * 3 == update_terms(CommShape(**comm))
    shape = memory_shape(_cfg("--use_group", "--num_generations", "8", "--bestofn", "4", "--train_batch_size", "2"), 2,
                         torch.device("cpu"))
    assert (shape.samples_per_rank, shape.trained_per_rank) == (16, 8)
