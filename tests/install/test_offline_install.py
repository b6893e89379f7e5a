"""Air-gapped install, end to end: download the cpu target's wheels, then install them into a fresh
venv with pip --no-index (env_setup.sh --wheelhouse) and run the tiny demo's first iteration there.

torch and its CUDA libraries are several GB, so the fresh venv sees this environment's torch (and
only torch and what torch itself needs) through a .pth file, and the wheelhouse is made with
--preinstalled torch==<that version>; everything else comes from the wheelhouse."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.network, pytest.mark.slow]


def _closure(name: str) -> list[md.Distribution]:
    """``name``'s installed distribution and, recursively, the installed ones it requires."""
    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(key)
        except md.PackageNotFoundError:
            continue  # a dependency for another platform or an extra nobody asked for
        seen[key] = dist
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or []]
    return list(seen.values())


def _overlay(dists: list[md.Distribution], out: Path) -> Path:
    """A folder of links to the files of ``dists`` only (their top-level packages and metadata)."""
    out.mkdir()
    for dist in dists:
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            top = f.parts[0]
            if top != ".." and not (out / top).exists() and (base / top).exists():
                (out / top).symlink_to(base / top)
    return out


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PIP_NO_INDEX"))}
    env.update(FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", **extra)
    return env


def test_wheelhouse_install_runs_the_demo(tmp_path):
    import torch

    wheelhouse = tmp_path / "wheelhouse"
    dl = subprocess.run(["bash", str(ROOT / "env_setup.sh"), "--target", "cpu", "--download", str(wheelhouse),
                         "--preinstalled", f"torch=={torch.__version__}"],
                        env=_env(PYTHON=sys.executable), capture_output=True, text=True, timeout=900)
    assert dl.returncode == 0, dl.stdout[-3000:] + dl.stderr[-3000:]
    names = {p.name.split("-")[0].lower() for p in wheelhouse.iterdir()}
    assert {"diffusers", "transformers", "torchvision", "setuptools"} <= names and "torch" not in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = subprocess.check_output([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    Path(site, "preinstalled_torch.pth").write_text(f"{_overlay(_closure('torch'), tmp_path / 'torch_only')}\n")
    inst = subprocess.run(["bash", str(ROOT / "env_setup.sh"), "--target", "cpu", "--venv", str(venv),
                           "--wheelhouse", str(wheelhouse)], env=_env(), capture_output=True, text=True, timeout=900)
    assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]
    assert "pip --no-index" in inst.stdout and "env_setup.sh: ok - torch" in inst.stdout
    # diffusers came from the wheelhouse into the fresh venv, not from this environment.
    where = subprocess.check_output([str(venv / "bin/python"), "-c", "import diffusers; print(diffusers.__file__)"],
                                    env=_env(), text=True)
    assert where.startswith(site)

    demo = tmp_path / "demo"
    run = subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], cwd=ROOT, capture_output=True, text=True,
                         env=_env(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{os.environ['PATH']}",
                                  PYTHON=str(venv / "bin/python"), DEMO_DIR=str(demo), STEPS="1"), timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # On the current line (LINE=current, as its CI suite runs) the FLUX demo writes outputs_current.
    out = "outputs_current" if os.environ.get("LINE") == "current" else "outputs"
    rows = [json.loads(line) for line in (demo / out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 1 and rows[0]["reward_mean"] == rows[0]["reward_mean"]  # one finite iteration
