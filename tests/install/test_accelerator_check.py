"""bench/accelerator_check.sh, run end to end with the CPU standing in for the accelerator: a fresh
venv that sees this environment as the box's own preinstalled packages (.pth), a wheelhouse holding
only what the editable install's build needs, and every step of the check must report."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.network, pytest.mark.slow]


def test_accelerator_check_runs_on_cpu(tmp_path):
    wheelhouse = tmp_path / "wh"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(wheelhouse), "setuptools>=64", "wheel"],
                   check=True, timeout=600)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = subprocess.check_output([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    Path(site, "box.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH"))}
    from fastvideo.library_lines import library_line

    # The box already has this environment's packages: install for its library line.
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", FASTVIDEO_DEVICE="cpu", ACCEL_TESTS="tests/test_devices.py",
               LINE=library_line())
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "bench/accelerator_check.sh"), str(wheelhouse), str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else ""
    assert r.returncode == 0, summary + r.stderr[-2000:]
    assert "install: ok" in summary
    assert "tests (tests/test_devices.py): rc=0" in summary
    assert "alignment cpu vs cpu: ALIGNED" in summary and (out / "alignment" / "report.md").is_file()
    # Same device, same draws: the first update sees exactly the rollout's log-probs.
    assert float((out / "first_ratio_dev.txt").read_text()) < 1e-5
    assert "options table: rc=0" in summary and "adamw foreach" in summary
    assert "gpu_flux_full.py --allow_cpu: rc=0" in summary and "total:" in summary
