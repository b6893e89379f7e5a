"""The real launchers run on CPU without reward weights: REWARDS= replaces their reward flags
(README "Smoke-test a launcher on CPU"). Each launcher trains one iteration of the tiny FLUX on 2
gloo ranks through its own torchrun line, with EXTRA_ARGS shrinking the sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SMOKE_ARGS = ("--h 64 --w 64 --sampling_steps 4 --num_generations 2 --rollout_batch_size 2 --max_train_steps 1 "
              "--mixed_precision no --dataloader_num_workers 0 --train_batch_size 1 --gradient_accumulation_steps 1 "
              "--save_images_every 0")


@pytest.mark.parametrize("launcher", ["finetune_flux_grpo_8gpus.sh", "finetune_flux_nft_8gpus.sh",
                                      "finetune_flux_mixgrpo_8gpus.sh"])
def test_launcher_trains_one_iteration_on_cpu_with_rewards_override(launcher, tiny_flux_dir, tiny_embeddings,
                                                                     tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(FASTVIDEO_DEVICE="cpu", NPROC="2", MODEL_PATH=str(tiny_flux_dir), DATA_JSON=str(tiny_embeddings),
               OUTPUT_DIR=str(out), REWARDS="compressibility:1.0", EXTRA_ARGS=SMOKE_ARGS, PYTHON=sys.executable,
               MASTER_PORT=str(19500 + hash(launcher) % 400), OMP_NUM_THREADS="1")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "finetune" / launcher)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["reward"]["spec"] == ["compressibility:1"]  # the launcher's own reward flags were replaced
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [row["iteration"] for row in rows] == [1]
    assert "reward/compressibility_mean" in rows[0]


def test_rewards_override_in_every_launchers_dry_run():
    """Every finetune launcher takes REWARDS= (no launcher keeps a reward flag of its own beside it).
    torch is asked for the device once, here (scripts/common.sh's FASTVIDEO_DEVICE_PROBE), not per launcher."""
    from fastvideo.tools.launcher_cost import device_probe

    base = dict(os.environ, DRY_RUN="1", FASTVIDEO_DEVICE="cpu", REWARDS="compressibility:1.0", PYTHON=sys.executable)
    probe = device_probe(base)
    assert probe == f"{sys.executable}|cpu|cpu"
    for script in sorted((ROOT / "scripts" / "finetune").glob("finetune_*.sh")):
        env = dict(base, FASTVIDEO_DEVICE_PROBE=probe)
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert r.returncode == 0, (script.name, r.stderr)
        command = r.stdout.strip().splitlines()[-1]
        assert "--rewards compressibility:1.0" in command, script.name
        for flag in ("--use_hpsv2", "--reward_model", "--hps_path", "pickscore:1.0", "hpsv2:1.0"):
            assert flag not in command, (script.name, flag)


def test_device_probe_answers_for_its_python_and_guess_only():
    """scripts/common.sh takes FASTVIDEO_DEVICE_PROBE's device (here a made-up "cuda", to see it is used)
    for the same PYTHON and guess, asks torch again for another PYTHON, and exports what it confirmed."""
    script = str(ROOT / "scripts" / "finetune" / "finetune_flux_grpo_8gpus.sh")
    env = dict(os.environ, DRY_RUN="1", FASTVIDEO_DEVICE="cpu", REWARDS="compressibility:1.0", PYTHON=sys.executable)
    lines = {}
    for owner in (sys.executable, "/another/python"):
        r = subprocess.run(["bash", script], capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env=dict(env, FASTVIDEO_DEVICE_PROBE=f"{owner}|cpu|cuda"))
        assert r.returncode == 0, r.stderr
        lines[owner] = r.stdout.splitlines()[0]
    assert lines[sys.executable].startswith("device: cuda;") and lines["/another/python"].startswith("device: cpu;")
    exported = subprocess.run(["bash", "-c", "source scripts/common.sh && echo \"$FASTVIDEO_DEVICE_PROBE\""],
                              capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={k: v for k, v in env.items() if k not in ("DRY_RUN", "FASTVIDEO_DEVICE_PROBE")})
    assert exported.stdout.strip() == f"{sys.executable}|cpu|cpu", exported.stderr
