"""Rewards under --sp_size: the ranks of a sequence group hold the same samples, so only the group's
first rank decodes and scores them and broadcasts the scores (training/reward_pipeline.py
share_rewards). A remote: reward server counting what it scores sees each sample once per sequence
group, with and without --reward_overlap, and the run equals one rank's; the broadcast gives each
group's other ranks that group's first rank's scores (totals, every component, NaN kept)."""

from __future__ import annotations

import threading

import pytest
import torch

from dist_utils import run_distributed
from helpers import ROOT, read_metrics, torchrun, train_args
from server_utils import serve_in_thread

ITERATIONS = 2
RTOL = 1e-5
EVAL_PROMPTS = 2  # evaluated at iterations 0 and ITERATIONS, one image each


def _share_body(info, sp):
    from fastvideo.algorithms.base import RewardResult
    from fastvideo.distributed import comm_count
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.training.reward_pipeline import share_rewards

    dims = ParallelDims.build(info.world_size, info.rank, sp=sp).init_groups()
    names = ["a", "b"]
    mine = None
    if dims.sp_rank == 0:  # each group's own scores: a rank fed another group's would differ
        g = float(dims.dp_rank)
        mine = RewardResult(total=torch.tensor([1.5 + g, float("nan"), -2.0 - g]),
                            per_reward={"a": torch.tensor([g, 0.25, 7.0]), "b": torch.tensor([3.0, -g, 1e-8])})
    comm_count.install()
    comm_count.reset()
    out = share_rewards(dims, mine, names, 3, info.device)
    calls = {k: v for k, v in comm_count.metrics().items() if k.endswith("_calls") and "/total/" not in k}
    assert out.total.dtype == torch.float32 and out.total.device.type == "cpu"
    # evaluation's scores [rounds, B, R] float64: NaN where this rank did not score
    from fastvideo.eval.core import _share_in_sequence_group

    local = torch.full((2, 3, 1), float("nan"), dtype=torch.float64)
    if dims.sp_rank == 0:
        local[0, :, 0] = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64) + dims.dp_rank
    shared = _share_in_sequence_group(local, info.device, dims)
    return {"total": out.total, "a": out.per_reward["a"], "b": out.per_reward["b"], "calls": calls,
            "same": mine is not None and out is mine, "eval": shared}


@pytest.mark.parametrize("world,sp", [(2, 2), (4, 2)])
def test_share_rewards_gives_each_group_its_first_ranks_scores(world, sp):
    """Training's scores (float32, with a NaN) and evaluation's (float64) on 2 ranks (one group) and
    4 (two groups of 2): every rank holds its own group's first rank's values, bit for bit."""
    results = run_distributed(_share_body, sp, world_size=world)
    for rank, res in enumerate(results):
        g = float(rank // sp)
        torch.testing.assert_close(res["total"], torch.tensor([1.5 + g, float("nan"), -2.0 - g]), rtol=0, atol=0,
                                   equal_nan=True)
        torch.testing.assert_close(res["a"], torch.tensor([g, 0.25, 7.0]), rtol=0, atol=0)
        torch.testing.assert_close(res["b"], torch.tensor([3.0, -g, 1e-8]), rtol=0, atol=0)
        assert res["same"] == (rank % sp == 0)  # the scoring rank keeps its own tensors
        assert res["calls"] == {"comm/other/broadcast_calls": 1}, res["calls"]  # one broadcast
        want = torch.full((2, 3, 1), float("nan"), dtype=torch.float64)
        want[0, :, 0] = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64) + g
        torch.testing.assert_close(res["eval"], want, rtol=0, atol=0, equal_nan=True)


def test_share_rewards_at_sp1_is_the_input_and_no_collective():
    from fastvideo.algorithms.base import RewardResult
    from fastvideo.distributed.parallel import ParallelDims
    from fastvideo.training.reward_pipeline import share_rewards

    mine = RewardResult(total=torch.ones(2), per_reward={"a": torch.ones(2)})
    # no process group exists here: any collective would raise
    assert share_rewards(ParallelDims.build(1, 0), mine, ["a"], 2, torch.device("cpu")) is mine


class CountingReward:
    """The image-detail reward, counting the images it is asked to score (server threads)."""

    def __init__(self):
        from fastvideo.rewards import build_reward

        self.reward, self.images, self.lock = build_reward("detail"), 0, threading.Lock()

    def __call__(self, images, prompts):
        with self.lock:
            self.images += len(prompts)
        return self.reward(images, prompts)


@pytest.mark.slow
def test_remote_reward_scored_once_per_sequence_group(tiny_flux_dir, tiny_embeddings, tmp_path):
    """3 runs through one counting server: 1 rank; sp = 2 on 2 ranks; sp = 2 with --reward_overlap
    on. Each scores ITERATIONS x 2 rollout samples and 2 x EVAL_PROMPTS evaluation images (before:
    sp x as many at sp = 2), and the rewards, losses, gradient norms and evaluation scores equal the
    one-rank run's (rank 1 trains on rank 0's broadcast scores)."""
    import json

    counting = CountingReward()
    from fastvideo.tools.reward_server import build_app

    prompts = tmp_path / "eval_prompts.txt"
    lines = (ROOT / "assets" / "eval_prompts.txt").read_text(encoding="utf-8").splitlines()
    prompts.write_text("\n".join(lines[:EVAL_PROMPTS]) + "\n", encoding="utf-8")
    evaluation = dict(eval_every=ITERATIONS, eval_prompts=str(prompts), eval_rewards="detail",
                      eval_num_images_per_prompt=1, eval_batch_size=EVAL_PROMPTS)

    runs = {}
    with serve_in_thread(build_app({"detail": counting})) as (url, _server):
        for name, nproc, more in (("sp1", 1, {}), ("sp2", 2, {"sp_size": 2}),
                                  ("sp2_overlap", 2, {"sp_size": 2, "reward_overlap": "on"})):
            before = counting.images
            out = tmp_path / name
            proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, out, rewards=f"remote:{url}/detail:1.0",
                                       max_train_steps=ITERATIONS, checkpointing_steps=ITERATIONS,
                                       save_images_every=1, **evaluation, **more), nproc=nproc)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
            runs[name] = (counting.images - before, read_metrics(out), out)
    for name, (scored, metrics, out) in runs.items():
        # num_generations 2, one prompt per iteration; two evaluations
        assert scored == ITERATIONS * 2 + 2 * EVAL_PROMPTS, (name, scored)
        assert [r["iteration"] for r in metrics] == list(range(1, ITERATIONS + 1))
        # the images rank 0 decoded are saved (save_images_every 1), from sp rank 0 only
        assert sorted(p.name for p in (out / "images").rglob("*.png")), name
    base = runs["sp1"][1]
    for name in ("sp2", "sp2_overlap"):
        for a, b in zip(base, runs[name][1]):
            for key in ("reward_mean", "reward/detail_mean", "grad_norm"):
                assert abs(a[key] - b[key]) <= RTOL * max(abs(a[key]), 1e-6), (name, key, a[key], b[key])
            assert abs(a["loss"] - b["loss"]) <= 1e-4, (name, a["loss"], b["loss"])
            assert b["comm/reward/broadcast_calls"] == 1, b  # the scores' one broadcast per iteration
        assert "comm/reward/broadcast_calls" not in base[0]
        evals = [[json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
                 for out in (runs["sp1"][2], runs[name][2])]
        assert [r["iteration"] for r in evals[1]] == [0, ITERATIONS]
        for a, b in zip(*evals):
            m1, m2 = a["rewards"]["detail"]["mean"], b["rewards"]["detail"]["mean"]
            assert abs(m1 - m2) <= RTOL * abs(m1), (name, m1, m2)
