"""Capture / replay end to end without the trainer: a rollout of the tiny FLUX whose random draws
were captured is reproduced by a run with another generator seed (and another world size) that
replays them, and compare_runs says so; without replay the other seed is told apart."""

import pytest
from alignment_helpers import Rewards, dist_info, make_cfg

from fastvideo.alignment.compare import compare_runs
from fastvideo.alignment.recorder import RunRecorder
from fastvideo.grpo.advantages import group_advantages
from fastvideo.models import flux
from fastvideo.rewards.compressibility import JpegCompressibilityReward
from fastvideo.sampling.randomness import RandomSource
from fastvideo.sampling.plan import full_sde_plan
from fastvideo.sampling.rollout import RolloutConfig, rollout

PROMPTS = ["a red cube on a table", "a cat"]
G = 2
CFG = RolloutConfig(height=64, width=64, sampling_steps=3, eta=0.3, shift=3.0, num_generations=G,
                    rollout_batch_size=2, init_same_noise=False)


@pytest.fixture(scope="module")
def setup(tiny_flux_dir):
    transformer = flux.load_transformer(tiny_flux_dir).eval()
    vae = flux.load_vae(tiny_flux_dir)
    enc = flux.load_text_encoders(tiny_flux_dir)
    embeds, pooled, text_ids = flux.encode_prompts(enc, PROMPTS, max_sequence_length=16)
    return transformer, vae, embeds, pooled, text_ids


def _record(setup, root, randomness: RandomSource, world_size=1, iterations=(1, 2), seed=0):
    """Each "rank" rolls out its share of the prompts and records it, as the trainer does."""
    transformer, vae, embeds, pooled, text_ids = setup
    reward = JpegCompressibilityReward()
    cfg = make_cfg(root, record_tensors=True, seed=seed)
    per_rank = len(PROMPTS) // world_size
    recorders = [RunRecorder(cfg, dist_info(r, world_size)) for r in range(world_size)]
    for it in iterations:
        for rank, rec in enumerate(recorders):
            idx = list(range(rank * per_rank, (rank + 1) * per_rank))
            cond = flux.FluxFamily().cond_from_tensors(
                [{"prompt_embeds": embeds[i], "pooled": pooled[i], "text_ids": text_ids} for i in idx])
            traj = rollout(flux.FluxFamily(), transformer, vae, cond, [PROMPTS[i] for i in idx], idx,
                           CFG, randomness, it, "cpu", plan=full_sde_plan(3, CFG.shift, 3, 1))
            total = reward(traj.images, traj.captions)
            adv = group_advantages(total, G, 5.0)
            rec.record_iteration(it, traj, Rewards(total, {"compressibility": total}), adv, {"loss": 0.0})
        randomness.flush()
    return root


def test_replay_with_another_seed_reproduces_the_run(setup, tmp_path):
    captured = _record(setup, tmp_path / "gpu", RandomSource(1).capture(tmp_path / "draws", rank=0, world_size=1))
    assert sorted(p.name for p in (tmp_path / "draws").iterdir()) == ["randomness_000001.safetensors",
                                                                      "randomness_000002.safetensors"]
    replayed = _record(setup, tmp_path / "npu", RandomSource(999).replay(tmp_path / "draws"), world_size=2, seed=999)
    cmp = compare_runs(captured, replayed)
    assert cmp.passed, [c.detail for c in cmp.checks]
    for c in cmp.iterations:
        assert c.reward.n == 4 and c.reward.max_rel == 0.0
        assert [d.psnr for d in c.images] == [float("inf")] * 4
        assert c.tensors["initial_noise_max_rel"] == 0.0 and c.tensors["latents_final_max_rel"] == 0.0
    assert cmp.config_diff["optim.seed"] == (0, 999)

    # Without replay, the other seed gives other noise: the comparison sees it.
    fresh = _record(setup, tmp_path / "other_seed", RandomSource(999), iterations=(1,))
    cmp = compare_runs(captured, fresh)
    it1 = cmp.iterations[0]
    assert it1.tensors["initial_noise_max_rel"] > 0.5
    assert it1.min_psnr < 40 and it1.reward.max_rel > 0
    assert any("randomness is not fixed" in w for w in cmp.warnings)
