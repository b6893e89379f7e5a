"""The trainer trains on MixGRPO's mixed advantages when --reward_model / --multi_reward_mix
are given (tiny HPS + CLIP: MixGRPO's hpsv2_clip_score)."""

import pytest
import torch

from fastvideo.rewards.advantages import mix_advantages
from helpers import single_process_trainer, train_args


@pytest.mark.parametrize("mode", ["advantage_aggr", "reward_aggr"])
def test_trainer_uses_mixed_advantages(tiny_flux_dir, tiny_embeddings, tiny_rewards, tmp_path, monkeypatch, mode):
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path, rewards=None, reward_model="hpsv2_clip_score",
                      hps_weight=3, clip_score_weight=1, multi_reward_mix=mode,
                      hps_ckpt_dir=tiny_rewards.hps_ckpt_dir, hps_model_name=tiny_rewards.hps_model_name,
                      clip_dir=tiny_rewards.pickscore_dir, num_generations=4, rollout_batch_size=4,
                      train_micro_batch_size=4, save_images_every=0, fsdp_sharding_strategy="none",
                      checkpointing_steps=100)
    trainer = single_process_trainer(argv, monkeypatch)
    assert [(s.name, s.weight) for s in trainer.cfg.reward.spec] == [("hpsv2", 0.75), ("clip", 0.25)]
    seen = {}
    real_rewards, real_update = trainer.compute_rewards, trainer.update

    def keep_rewards(traj):
        seen["rewards"] = real_rewards(traj)
        return seen["rewards"]

    def keep_advantages(traj, advantages, iteration):
        seen["advantages"] = advantages.clone()
        return real_update(traj, advantages, iteration)

    trainer.compute_rewards, trainer.update = keep_rewards, keep_advantages
    trainer.run_iteration()
    raw = seen["rewards"].per_reward
    expected = mix_advantages(raw, {"hpsv2": 0.75, "clip": 0.25}, 4, mode).clamp(-5, 5)
    assert torch.equal(seen["advantages"], expected)
    # reward_aggr is the default path (normalise the weighted total, sample std as upstream);
    # advantage_aggr normalises each reward first, which the default path would not give.
    default = trainer.objective.group_advantages(seen["rewards"].total)
    if mode == "reward_aggr":
        torch.testing.assert_close(seen["advantages"], default)
    else:
        assert not torch.allclose(seen["advantages"], default)
