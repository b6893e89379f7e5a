"""Training with remote: rewards: a 2-rank run through a reward server on 127.0.0.1 equals the
in-process run; a dead URL fails before any model loads; a server lost mid-run is retried,
then fails clearly, and the checkpoint before it stays loadable."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from helpers import ROOT, read_metrics, single_process_trainer, torchrun, train_args
from server_utils import free_port, serve_in_thread


def test_dead_url_fails_before_any_model_loads(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    from fastvideo.rewards.remote import RemoteRewardError
    from fastvideo.training import builders

    def no_models(*_):
        raise AssertionError("a model was loaded before the reward URL was checked")

    monkeypatch.setattr(builders, "build_models", no_models)
    monkeypatch.setattr(builders, "build_dataset", no_models)
    url = f"http://127.0.0.1:{free_port()}"
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path, rewards=f"remote:{url}/hpsv2:1.0")
    with pytest.raises(RemoteRewardError, match=f"reward server {url} .*does not answer"):
        single_process_trainer(argv, monkeypatch)


class StopsServerAfter:
    """Compressibility that shuts its server down after ``calls`` requests (the reply to the last
    one still goes out: uvicorn finishes requests in flight)."""

    def __init__(self, calls):
        from fastvideo.rewards import build_reward

        self.reward, self.calls, self.server = build_reward("compressibility"), calls, None

    def __call__(self, images, prompts):
        self.calls -= 1
        if self.calls == 0:
            self.server.should_exit = True
        return self.reward(images, prompts)


def test_server_lost_mid_run(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch, caplog):
    from safetensors.torch import load_file

    from fastvideo.rewards.remote import RemoteRewardError
    from fastvideo.tools.reward_server import build_app
    from fastvideo.training.checkpoint import verify_checkpoint

    reward = StopsServerAfter(calls=1)  # one request per iteration: iteration 2 finds no server
    with serve_in_thread(build_app({"compressibility": reward})) as (url, server):
        reward.server = server
        argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path, rewards=f"remote:{url}/compressibility",
                          max_train_steps=3, checkpointing_steps=1, save_images_every=0,
                          fsdp_sharding_strategy="none", reward_retries=1, reward_timeout=5)
        trainer = single_process_trainer(argv, monkeypatch)
        with pytest.raises(RemoteRewardError, match=f"{url} \\(compressibility\\) failed 2 times"):
            trainer.train()
    assert "retry 1/1" in caplog.text
    ckpt = tmp_path / "checkpoint-1"
    verify_checkpoint(ckpt)
    weights = load_file(str(ckpt / "diffusion_pytorch_model.safetensors"))
    assert weights and all(torch.isfinite(v).all() for v in weights.values())
    assert not (tmp_path / "checkpoint-2").exists()


def _start_server(tiny_rewards, port: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), FASTVIDEO_DEVICE="cpu")
    cmd = [sys.executable, "-m", "fastvideo.tools.reward_server", "--rewards", "hpsv2", "--device", "cpu",
           "--hps_ckpt_dir", str(tiny_rewards.hps_ckpt_dir), "--hps_model_name", tiny_rewards.hps_model_name,
           "--batch_size", "2", "--host", "127.0.0.1", "--port", str(port)]
    # Its log goes to a file, not a pipe nobody reads: one line per request would fill a pipe's
    # buffer in a long run and block the server.
    log = tempfile.NamedTemporaryFile("w+", prefix="reward_server_", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reward server exited: {Path(log.name).read_text()}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("reward server did not come up in 120 s")


@pytest.mark.slow
def test_two_rank_run_through_a_reward_server_equals_in_process(tiny_flux_dir, tiny_embeddings, tiny_rewards,
                                                                tmp_path):
    """2 gloo ranks score through one server (overlapped with the rollout); every logged reward,
    advantage and loss equals the in-process run's, and so do the trained weights."""
    from safetensors.torch import load_file

    port = free_port()
    server = _start_server(tiny_rewards, port)
    runs = {}
    try:
        for mode, spec in (("remote", f"remote:http://127.0.0.1:{port}/hpsv2:1.0"), ("local", "hpsv2:1.0")):
            out = tmp_path / mode
            proc = torchrun(train_args(
                tiny_embeddings, tiny_flux_dir, out, rewards=spec, hps_ckpt_dir=tiny_rewards.hps_ckpt_dir,
                hps_model_name=tiny_rewards.hps_model_name, reward_batch_size=2, reward_overlap="on",
                max_train_steps=2, checkpointing_steps=2, num_generations=4, rollout_batch_size=3,
                use_group=False, save_images_every=0))
            assert proc.returncode == 0, proc.stderr[-4000:]
            runs[mode] = (read_metrics(out), load_file(str(out / "checkpoint-2" / "diffusion_pytorch_model.safetensors")))
    finally:
        server.terminate()
        server.wait(30)
    (rows_r, w_r), (rows_l, w_l) = runs["remote"], runs["local"]
    assert len(rows_r) == len(rows_l) == 2
    for a, b in zip(rows_r, rows_l):
        for key in ("reward_mean", "reward_std", "reward/hpsv2_mean", "adv_mean", "adv_std", "loss", "grad_norm"):
            assert a[key] == b[key], key
    assert rows_r[0]["reward/hpsv2_std"] > 0
    assert all(torch.equal(w_r[k], w_l[k]) for k in w_l)
