"""Overlapped decode + reward scoring (fastvideo.training.reward_pipeline) against the serial path."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from helpers import single_process_trainer, train_args


def _two_iterations(tiny_flux_dir, tiny_embeddings, out, monkeypatch, **flags):
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, num_generations=4, train_batch_size=2,
                      rollout_batch_size=3, train_micro_batch_size=4, save_images_every=0,
                      checkpointing_steps=100, fsdp_sharding_strategy="none", reward_group_norm=True,
                      **flags)
    trainer = single_process_trainer(argv, monkeypatch)
    images = []
    real_update = trainer.update

    def keep_images(traj, advantages, iteration):
        images.append(traj.images.clone())
        return real_update(traj, advantages, iteration)

    trainer.update = keep_images
    records = [trainer.run_iteration() for _ in range(2)]
    params = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return trainer, records, images, params


PROMPT_REWARD = "toy_plugins:PromptLength"  # tests/training/toy_plugins.py: the image's mean + 0.01 per prompt character


def test_overlap_gives_the_serial_results_bit_for_bit(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    """8 samples (2 prompts x 4) in chunks of 3 (the last chunk is short) with group-normalised
    rewards, one of them prompt-dependent (each sample must be scored against its own prompt):
    images, rewards, advantages' statistics, losses and the updated weights equal the serial path's."""
    rewards = f"compressibility:1.0,{PROMPT_REWARD}:0.5"
    on, rec_on, img_on, par_on = _two_iterations(tiny_flux_dir, tiny_embeddings, tmp_path / "on", monkeypatch,
                                                 reward_overlap="on", rewards=rewards)
    off, rec_off, img_off, par_off = _two_iterations(tiny_flux_dir, tiny_embeddings, tmp_path / "off", monkeypatch,
                                                     reward_overlap="off", rewards=rewards)
    assert on.scorer is not None and off.scorer is None
    for a, b in zip(img_on, img_off):
        assert a.shape == (8, 3, 32, 32)
        assert torch.equal(a, b)
    for a, b in zip(rec_on, rec_off):
        for key in ("reward_mean", "reward_std", "reward/compressibility_mean", f"reward/{PROMPT_REWARD}_mean",
                    f"reward/{PROMPT_REWARD}_std", "adv_mean", "adv_std", "loss", "grad_norm", "ratio_mean"):
            assert a[key] == b[key], key
        assert a["time_reward_busy"] > 0 and "time_reward_busy" not in b
        assert a["time_decode"] > 0 and a["time_rollout"] > 0
    assert par_on.keys() == par_off.keys()
    assert all(torch.equal(par_on[k], par_off[k]) for k in par_on)
    on.scorer.close()


class _SlowReward:
    """Sleeps (releasing the GIL, like a reward model's kernels) and records the thread it ran on."""

    name = "slow"

    def __init__(self, seconds):
        self.seconds = seconds
        self.threads = set()

    def __call__(self, images, prompts):
        self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)
        return images.mean(dim=(1, 2, 3))


def _scorer(tiny_flux_dir, reward):
    from fastvideo.models import flux
    from fastvideo.rewards.combine import MultiReward
    from fastvideo.sampling.rollout import RolloutConfig
    from fastvideo.training.metrics import PhaseTimer
    from fastvideo.training.reward_pipeline import ChunkScorer

    cfg = RolloutConfig(height=32, width=32, sampling_steps=2, eta=0.0, shift=3.0, num_generations=2,
                        rollout_batch_size=2, init_same_noise=False)
    vae = flux.load_vae(tiny_flux_dir)
    timer = PhaseTimer(torch.device("cpu"))
    scorer = ChunkScorer(MultiReward([("slow", 1.0, reward)]), vae, cfg, torch.device("cpu"), None, timer,
                         flux.FluxFamily())
    return scorer, timer


def test_scoring_runs_behind_the_next_chunk(tiny_flux_dir):
    """4 chunks, each scored for 0.2 s while 0.25 s of 'sampling' goes on: finish() only waits for
    the last chunk's scoring, not for all four."""
    reward = _SlowReward(0.2)
    scorer, timer = _scorer(tiny_flux_dir, reward)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(8, 4, 64, generator=gen)  # 32x32 image -> 4x4 latent -> 2x2 = 4 packed tokens
    scorer.begin([f"prompt {i}" for i in range(8)])
    for start in range(0, 8, 2):
        scorer.on_chunk(slice(start, start + 2), x0[start:start + 2])
        time.sleep(0.25)  # the next chunk's sampling
    t = time.perf_counter()
    out = scorer.finish()
    waited = time.perf_counter() - t
    scorer.close()
    assert out.busy_s >= 0.8
    # Scored after sampling, finish() would wait 4 x 0.2 = 0.8 s; overlapped, at most the last
    # chunk's 0.2 s (0 when it finished during the last 'sampling'). 0.6 separates the two with
    # room for a loaded CI machine's scheduling delays.
    assert waited < 0.6
    assert reward.threads and all(name.startswith("reward") for name in reward.threads)
    assert torch.equal(out.raw["slow"], out.images.mean(dim=(1, 2, 3)))
    assert out.images.shape == (8, 3, 32, 32) and timer.seconds["decode"] > 0


def test_a_failing_reward_is_raised_by_finish(tiny_flux_dir):
    class Broken(_SlowReward):
        def __call__(self, images, prompts):
            raise ValueError("reward model exploded")

    scorer, _ = _scorer(tiny_flux_dir, Broken(0.0))
    scorer.begin(["a", "b"])
    scorer.on_chunk(slice(0, 2), torch.zeros(2, 4, 64))
    with pytest.raises(ValueError, match="reward model exploded"):
        scorer.finish()
    # the scorer is usable again for the next batch
    scorer.begin(["a", "b"])
    scorer.close()


def test_auto_overlaps_only_across_devices():
    from fastvideo.training.builders import overlap_reward_scoring

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 1)
    assert overlap_reward_scoring("auto", gpu, cpu) is True  # --reward_device cpu while a GPU samples
    assert overlap_reward_scoring("auto", gpu, gpu) is False
    assert overlap_reward_scoring("auto", cpu, cpu) is False  # they would share the CPU's cores
    assert overlap_reward_scoring("on", cpu, cpu) is True
    assert overlap_reward_scoring("off", gpu, cpu) is False


@pytest.mark.slow
def test_two_process_run_with_overlap_matches_serial(tiny_flux_dir, tiny_embeddings, tmp_path):
    """2 gloo ranks, FSDP, batch-wide advantages (gathered across ranks): forcing the overlap on
    changes no logged value and no trained weight."""
    from safetensors.torch import load_file

    from helpers import read_metrics, torchrun

    runs = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=2, checkpointing_steps=2,
                                   use_group=False, num_generations=4, rollout_batch_size=3,
                                   save_images_every=0, reward_overlap=mode))
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[mode] = (read_metrics(out), load_file(str(out / "checkpoint-2" / "diffusion_pytorch_model.safetensors")))
    (rows_on, w_on), (rows_off, w_off) = runs["on"], runs["off"]
    for a, b in zip(rows_on, rows_off):
        for key in ("reward_mean", "reward_std", "adv_mean", "adv_std", "loss", "grad_norm"):
            assert a[key] == b[key], key
    assert all(torch.equal(w_on[k], w_off[k]) for k in w_off)
