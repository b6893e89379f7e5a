"""Batched timestep replay (--update_timesteps_per_forward): one forward + backward over K stacked
(sample, timestep) terms gives the gradients of the per-timestep loop (fp32, 1e-6 relative) and
the same statistics, for GRPO's SDE kinds, MixGRPO's window, the KL term, LoRA and NFT."""

from __future__ import annotations

import pytest
import torch

from helpers import single_process_trainer, train_args

from fastvideo.algorithms.base import StatsAccumulator, stack_timesteps

BASE = dict(sampling_steps=4, num_generations=2, rollout_batch_size=2, train_micro_batch_size=2,
            timestep_fraction=1.0, max_train_steps=1, save_images_every=0)
CASES = {
    "grpo_dance": {},
    "grpo_flow_kl": {"flow_grpo_sampling": True, "kl_coef": 0.1},
    "mixgrpo_window": {"training_strategy": "part", "group_size": 2, "sampling_steps": 5},
    "lora_kl": {"use_lora": True, "lora_rank": 4, "lora_alpha": 8, "kl_coef": 0.1},
    "nft": {"algorithm": "nft", "nft_beta": 0.5},
}


def _gradients(trainer, traj, adv, k: int):
    model = trainer.model
    model.zero_grad(set_to_none=True)
    stats = StatsAccumulator(trainer.device)
    micro = stack_timesteps(trainer.objective.plan_update(traj, 1), k)
    total = torch.zeros(())
    for terms in micro:
        for term in terms:
            loss = trainer.objective.loss(trainer.policy, traj, adv, term, stats)
            loss.backward()
            total += loss.detach()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return grads, trainer.objective.summarize(stats)[0], stats, micro, total


@pytest.mark.parametrize("case", list(CASES))
def test_stacked_terms_give_the_loop_gradients(tiny_flux_dir, tiny_embeddings, tmp_path, case):
    mp = pytest.MonkeyPatch()
    try:
        trainer = single_process_trainer(train_args(tiny_embeddings, tiny_flux_dir, tmp_path,
                                                    **{**BASE, **CASES[case]}), mp)
        traj, rewards = trainer._sample_and_score(1, trainer.sampler.next_batch())
        adv = trainer.compute_advantages(rewards)
        trainer.model.train()
        loop, loop_means, loop_stats, loop_micro, loop_loss = _gradients(trainer, traj, adv, 1)
        T = len(loop_micro[0])
        assert T >= 2 and all(len(t.rows) == 2 for m in loop_micro for t in m)
        for k in (2, T):
            got, means, stats, micro, loss = _gradients(trainer, traj, adv, k)
            assert [len(m) for m in micro] == [-(-T // k)] * len(loop_micro)  # ceil(T / k) forwards a micro-batch
            assert stats.terms == loop_stats.terms and stats.forwards == len(micro) * -(-T // k)
            rel = float((got - loop).norm() / loop.norm())
            assert loop.norm() > 0 and rel <= 1e-6, (case, k, rel)
            for key, value in loop_means.items():
                assert means[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (case, k, key)
            assert float(loss) == pytest.approx(float(loop_loss), rel=1e-4, abs=1e-6)
    finally:
        mp.undo()


def test_stack_timesteps_concatenates_rows_and_steps():
    from fastvideo.algorithms.base import Term

    rows = torch.tensor([4, 5])
    micro = [[Term(0, rows, torch.tensor([t, t + 1])) for t in range(5)]]
    out = stack_timesteps(micro, 2)[0]
    assert [t.timesteps for t in out] == [2, 2, 1]
    assert out[0].rows.tolist() == [4, 5, 4, 5] and out[0].steps.tolist() == [0, 1, 1, 2]
    assert out[2].rows.tolist() == [4, 5] and out[2].steps.tolist() == [4, 5]
    assert stack_timesteps(micro, 1) is micro
