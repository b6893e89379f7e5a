"""MixGRPO / Flash / Flow-GRPO-Fast in the trainer: pass counts, exact resume, MixGRPO's launch line."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from helpers import ROOT, read_metrics, single_process_trainer, train_args

WINDOW = dict(training_strategy="part", group_size=2, iters_per_group=1, sample_strategy="progressive",
              prog_overlap=True, prog_overlap_step=1, roll_back=True)
MODES = {
    "full": {},
    "mixgrpo": WINDOW,
    "flash": dict(WINDOW, dpm_algorithm_type="dpmsolver++", dpm_post_compress_ratio=0.5, dpm_solver_type="midpoint"),
    "fast": dict(sde_steps=1, sde_start="random"),
    # MixGRPO's --dpm_apply_strategy all: DPM-Solver++ (order 3) everywhere, SDE-DPM-Solver++ window
    "dpm_all": dict(WINDOW, dpm_algorithm_type="dpmsolver++", dpm_apply_strategy="all", dpm_solver_order=3),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_transformer_passes_equal_the_analytic_count(mode, tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    from fastvideo.perf.flops import pass_counts

    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path, sampling_steps=8, max_train_steps=2,
                      save_images_every=0, num_generations=3, rollout_batch_size=2, train_micro_batch_size=2,
                      init_same_noise=True, **MODES[mode])
    trainer = single_process_trainer(argv, monkeypatch)
    calls = {"fwd": 0, "bwd": 0}

    def count(module, args, kwargs):
        calls["fwd"] += int(kwargs["hidden_states"].shape[0])

    trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    real_backward = torch.Tensor.backward

    def backward(t, *a, **k):
        calls["bwd"] += 1
        return real_backward(t, *a, **k)

    monkeypatch.setattr(torch.Tensor, "backward", backward)
    for it in (1, 2):
        calls.update(fwd=0, bwd=0)
        plan = trainer.sampling_plan(it)
        rec = trainer.run_iteration()
        # one prompt of G = 3 per iteration: a shared ODE prefix runs once for the 3 samples
        assert rec["shared_ode_prefix"] == plan.shared_prefix()
        n = pass_counts(plan.num_steps, plan.num_trained, 3, 2, 2, shared_prefix=plan.shared_prefix(), prompts=1)
        assert calls["fwd"] == n.rollout_forward_samples + n.update_forward_samples
        assert calls["bwd"] == n.update_calls
        assert rec["forward_passes_update"] == n.update_calls
        assert rec["forward_passes_rollout"] == n.rollout_forward_samples
        # on policy: the update re-scores the rollout's transitions with the rollout's step
        assert rec["first_ratio_dev"] < 1e-4, rec["first_ratio_dev"]
    expected = {"full": (8, 3), "mixgrpo": (8, 2), "flash": (None, 2), "fast": (8, 1), "dpm_all": (8, 2)}[mode]
    assert plan.num_trained == expected[1] and (expected[0] is None or plan.num_steps == expected[0])
    if mode == "flash":  # window at 1 (iteration 2): O S S, then int((8 - 2) * 0.5) = 3 points -> 2 DPM steps
        assert plan.describe() == "OSSDD" and rec["sde_window_start"] == 1
    if mode == "mixgrpo":
        assert plan.describe() == "OSSOOOOO" and rec["shared_ode_prefix"] == 1
    if mode == "dpm_all":
        assert plan.describe() == "DSSDDDDD" and plan.sde_kind == "sde-dpmsolver++"


def test_resume_is_exact_in_mixgrpo_mode_and_refuses_another_window(tiny_flux_dir, tiny_embeddings, tmp_path,
                                                                    monkeypatch):
    from fastvideo.config import ConfigError

    common = dict(save_images_every=0, checkpointing_steps=2, sampling_steps=6, **MODES["flash"])
    straight = single_process_trainer(train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "a", max_train_steps=3,
                                                 **common), monkeypatch)
    straight.train()
    single_process_trainer(train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "b", max_train_steps=2, **common),
                           monkeypatch).train()
    resumed = single_process_trainer(train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "b", max_train_steps=3,
                                                resume_from_checkpoint="latest", **common), monkeypatch)
    assert resumed.iteration == 2
    resumed.train()
    a = load_file(str(tmp_path / "a" / "checkpoint-3" / "diffusion_pytorch_model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoint-3" / "diffusion_pytorch_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["sde_window_start"] for r in ma] == [r["sde_window_start"] for r in mb] == [0, 1, 2]
    assert [r["reward_mean"] for r in ma] == [r["reward_mean"] for r in mb]
    with pytest.raises(ConfigError, match=r"sde_window \(--group_size / --sde_steps\): checkpoint 2, this run 3"):
        single_process_trainer(train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "b", max_train_steps=4,
                                          resume_from_checkpoint="latest", **dict(common, group_size=3)), monkeypatch)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher_env(tiny_flux_dir, tiny_embeddings, out, hps_dir, hps_name, **extra) -> dict:
    env = dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHON=sys.executable,
               PYTHONPATH=str(ROOT), NPROC="2", MASTER_PORT=str(_free_port()), MODEL_PATH=str(tiny_flux_dir),
               DATA_JSON=str(tiny_embeddings), OUTPUT_DIR=str(out), HPS_DIR=str(hps_dir),
               EXTRA_ARGS=f"--h 32 --w 32 --max_train_steps 2 --hps_model_name {hps_name} --dataloader_num_workers 0 "
                          "--save_images_every 0")
    env.update(extra)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("flash", ["0", "1", "star"])
def test_mixgrpo_launch_line_trains_two_iterations_on_two_ranks(flash, tiny_flux_dir, tiny_embeddings, tmp_path):
    """MixGRPO's finetune_flux_grpo_MixGRPO{,_Flash,_Flash*}.sh flag set, through our launcher, on the tiny model."""
    from fastvideo.tools.make_tiny_reward import HPS_PRESETS, write_hps

    hps_dir = write_hps(tmp_path / "hps", seed=0, preset="tiny")[0]
    out = tmp_path / "run"
    env = _launcher_env(tiny_flux_dir, tiny_embeddings, out, hps_dir, HPS_PRESETS["tiny"][0], FLASH=flash,
                        REWARD_MODEL="hpsv2")
    script = ROOT / "scripts" / "finetune" / "finetune_flux_mixgrpo_a3_16die.sh"
    dry = subprocess.run(["bash", str(script)], env=dict(env, DRY_RUN="1"), capture_output=True, text=True, cwd=ROOT)
    words = shlex.split(dry.stdout.strip().splitlines()[-1])
    for flag in ("--training_strategy", "--prog_overlap", "--roll_back", "--flow_grpo_sampling", "--reward_model",
                 "--multi_reward_mix", "--kl_coeff", "--trimmed_ratio", "--frozen_init_timesteps"):
        assert flag in words
    # the DPM-Solver tail's flags where there is one (FLASH=0 leaves out what would do nothing)
    assert ("--dpm_solver_type" in words) == (flash != "0")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2] and [r["sde_window_start"] for r in rows] == [0, 0]
    # 12 samples per rank; 25 steps (Flash: 4 SDE + int(22 * 0.4) - 1 = 7 DPM-Solver++ steps;
    # Flash*: 4 SDE + int(22 * 0.2) - 1 = 3)
    assert rows[0]["forward_passes_rollout"] == 12 * {"0": 25, "1": 11, "star": 7}[flash]
    assert all(r["loss"] == r["loss"] and r["grad_norm"] == r["grad_norm"] for r in rows)
    assert (out / "checkpoint-2" / "COMPLETE.json").is_file()


def test_mixgrpo_launchers_dry_run_parse(tmp_path):
    from fastvideo.config import build_parser, validate_args
    from fastvideo.sampling import mix

    for name, nproc in (("finetune_flux_mixgrpo_a3_16die.sh", "16"), ("finetune_flux_mixgrpo_8gpus.sh", "8")):
        for flash in ("0", "1", "star"):
            env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
                   "FLASH": flash, "HOME": os.environ.get("HOME", "/root")}
            out = subprocess.run(["bash", str(ROOT / "scripts" / "finetune" / name)], capture_output=True, text=True,
                                 env=env, cwd=ROOT, timeout=120)
            assert out.returncode == 0, out.stderr
            words = shlex.split(out.stdout.strip().splitlines()[-1])
            assert f"--nproc_per_node={nproc}" in words
            argv = words[words.index("fastvideo/train_grpo_flux.py") + 1:]
            cfg = validate_args(build_parser().parse_args(argv))
            assert cfg.mix.mode == "window" and cfg.mix.window_size == 4 and cfg.mix.sde_kind == "flow"
            assert cfg.mix.iters_per_group == (25 if flash == "0" else 20)
            assert cfg.mix.dpm_post_ratio == {"0": None, "1": 0.4, "star": 0.2}[flash]
            # Flash* (prog_overlap_step 0): the window never leaves the first 4 steps
            assert cfg.mix.move_step == (0 if flash == "star" else 1)
            assert mix.scheduled_start(cfg.mix, 301, 23) == {"0": 12, "1": 15, "star": 0}[flash]
            # MixGRPO's multi_reward, no judge (UNIFIED_REWARD_URL None), weights 1/3 each
            assert [s.name for s in cfg.reward.spec] == ["hpsv2", "imagereward", "pickscore"]
            assert [s.weight for s in cfg.reward.spec] == pytest.approx([1 / 3] * 3)
            assert cfg.reward.extras.multi_reward_mix == "advantage_aggr" and cfg.reward.hps_ckpt_dir == "hps_ckpt"
            assert cfg.reward.extras.image_reward_dir == "image_reward_ckpt" and cfg.reward.pickscore_dir == "data/pickscore"
        env["FLASH"] = "2"
        out = subprocess.run(["bash", str(ROOT / "scripts" / "finetune" / name)], capture_output=True, text=True,
                             env=env, cwd=ROOT, timeout=120)
        assert out.returncode == 2 and "FLASH=2" in out.stderr
