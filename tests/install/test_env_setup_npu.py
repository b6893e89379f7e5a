"""env_setup.sh --target npu on fake CANN trees, with a pip stand-in that records what it would run
(torch-npu is never really installed). The interpreter is a fresh venv without pip; since the stand-in
installs nothing, the final import check finds small stand-in modules, and torch_npu's refuses to
import unless CANN's set_env.sh was sourced first (as the real one fails without CANN's libraries)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import install_plan  # noqa: E402


def _fake_cann(root: Path, version: str, layout: str = "cann", set_env: bool = True) -> Path:
    """A CANN tree as the installer lays it out: version in <arch>-linux/ascend_toolkit_install.info,
    set_env.sh at the top (cann/) or one level up (ascend-toolkit/latest)."""
    home = root / ("cann" if layout == "cann" else "ascend-toolkit/latest")
    info = home / "x86_64-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text(f"package_name=Ascend-cann-toolkit\nversion={version}\ninnerversion=V100R001\narch=x86_64\n")
    if set_env:
        target = home / "set_env.sh" if layout == "cann" else home.parent / "set_env.sh"
        # Reads an unset variable the way the real one does (LD_LIBRARY_PATH may be unset).
        target.write_text(f'export FAKE_CANN_SOURCED={version}\nexport LD_LIBRARY_PATH="$LD_LIBRARY_PATH:{home}"\n')
    return home


def _run(venv: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "env_setup.sh"), "--target", "npu", "--venv", str(venv), *args],
                          env=env, capture_output=True, text=True, timeout=120)


def _pip_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("version,expected", [("8.3.RC1", "torch-npu==2.7.1"), ("8.5.0", "torch-npu==2.7.1.post2")])
def test_cann_version_selects_torch_npu(env, tmp_path, version, expected):
    venv, e, log = env
    home = _fake_cann(tmp_path, version)
    r = _run(venv, e, "--cann-home", str(home))
    assert r.returncode == 0, r.stderr
    first = _pip_lines(log)[0].split()
    assert first[:2] == ["install", "--disable-pip-version-check"]
    assert expected in first and f"{expected}.post2" not in first
    # This host is x86_64: PyTorch's CPU build from its CPU index, and CANN's Python dependencies.
    assert "torch==2.7.1+cpu" in first and "torchvision==0.22.1+cpu" in first
    assert first[first.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    for dep in ("decorator", "sympy", "cffi", "attrs", "psutil", "scipy", "absl-py==2.3.1", "protobuf==3.20.0"):
        assert dep in first
    assert _pip_lines(log)[1].endswith(f"-e .[test,video] -c {ROOT / 'constraints' / 'recipe.txt'}")
    # set_env.sh was sourced before the final import (the torch_npu stand-in refuses otherwise).
    assert f"sourced {home / 'set_env.sh'}" in r.stdout and "env_setup.sh: ok - torch" in r.stdout


def test_override_and_toolkit_layout(env, tmp_path):
    venv, e, log = env
    home = _fake_cann(tmp_path, "8.3.RC1", layout="toolkit")
    r = _run(venv, e, "--cann-home", str(home), "--cann-version", "8.5.0")
    assert r.returncode == 0, r.stderr
    assert "torch-npu==2.7.1.post2" in _pip_lines(log)[0].split()
    assert f"sourced {home.parent / 'set_env.sh'}" in r.stdout


def test_unknown_cann_version_refused_with_table(env, tmp_path):
    venv, e, log = env
    r = _run(venv, e, "--cann-home", str(_fake_cann(tmp_path, "8.4.RC9")))
    assert r.returncode == 2 and not _pip_lines(log)
    assert "CANN '8.4.RC9'" in r.stderr and "CANN 8.5.0    -> torch-npu 2.7.1.post2" in r.stderr
    assert "--cann-version" in r.stderr


def test_missing_set_env_refused_before_installing(env, tmp_path):
    venv, e, log = env
    r = _run(venv, e, "--cann-home", str(_fake_cann(tmp_path, "8.5.0", set_env=False)))
    assert r.returncode == 2 and not _pip_lines(log)
    assert "set_env.sh is missing" in r.stderr and "CANN_SET_ENV" in r.stderr


def test_python_312_refused_with_the_fix(env, tmp_path):
    venv, e, log = env
    real = venv / "bin" / "python-real"
    (venv / "bin" / "python").rename(real)
    # An interpreter that reports 3.12 for env_setup.sh's version query and is the real one otherwise.
    (venv / "bin" / "python").write_text(
        f'#!/bin/sh\ncase "$2" in *version_info*) echo 3.12; exit 0;; esac\nexec {real} "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    r = _run(venv, e, "--cann-home", str(_fake_cann(tmp_path, "8.5.0")))
    assert r.returncode == 2 and not _pip_lines(log)
    assert "Python 3.12 cannot run the recipe line's torch-npu" in r.stderr
    assert "conda create -n flux_grpo python=3.11" in r.stderr


def test_plan_aarch64_takes_plain_torch():
    args = install_plan.torch_args("npu", "3.10", "aarch64", "8.3.RC1")
    assert args[:3] == ["torch==2.7.1", "torchvision==0.22.1", "torch-npu==2.7.1"]
    assert "--extra-index-url" not in args
    with pytest.raises(install_plan.PlanError, match="x86_64 and aarch64"):
        install_plan.torch_args("npu", "3.11", "ppc64le", "8.5.0")


def test_project_requirements_match_tomllib():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = data["project"]["optional-dependencies"]
    want = data["project"]["dependencies"] + extras["test"] + extras["video"]
    assert install_plan.project_requirements(ROOT / "pyproject.toml") == want
    # env_setup.sh installs the same extras as the wheelhouse holds (--download reads this list)
    assert '-e ".[test,video]"' in (ROOT / "env_setup.sh").read_text() and install_plan.INSTALL_EXTRAS == ("test", "video")


def test_platform_tags_widen_manylinux():
    tags = install_plan.platform_tags("manylinux_2_28_aarch64")
    assert tags[0] == "manylinux_2_28_aarch64" and "manylinux_2_17_aarch64" in tags and tags[-1] == "manylinux2014_aarch64"
    assert install_plan.platform_tags("win_amd64") == ["win_amd64"]


@pytest.mark.parametrize("version,torch,npu", [("8.5.0", "2.9.0", "2.9.0"), ("9.0.0", "2.10.0", "2.10.0"),
                                               ("9.1.0", "2.10.0", "2.10.0.post4")])
def test_current_line_pairs_cann_with_its_torch(env, tmp_path, version, torch, npu):
    """The current line's pairs (Ascend/pytorch README, v2.12.0 version table) and its constraints."""
    venv, e, log = env
    r = _run(venv, e, "--cann-home", str(_fake_cann(tmp_path, version)), "--line", "current")
    assert r.returncode == 0, r.stderr
    first = _pip_lines(log)[0].split()
    assert f"torch=={torch}+cpu" in first and f"torch-npu=={npu}" in first
    assert _pip_lines(log)[1].endswith(f"-e .[test,video] -c {ROOT / 'constraints' / 'current.txt'}")
    assert "current line" in r.stdout


def test_cann_known_only_to_the_other_line_names_it(env, tmp_path):
    venv, e, log = env
    r = _run(venv, e, "--cann-home", str(_fake_cann(tmp_path, "8.3.RC1")), "--line", "current")
    assert r.returncode == 2 and not _pip_lines(log)
    assert "on the current line" in r.stderr and "--line recipe" in r.stderr


def test_unknown_line_refused(env, tmp_path):
    venv, e, log = env
    r = _run(venv, e, "--cann-home", str(_fake_cann(tmp_path, "8.5.0")), "--line", "nightly")
    assert r.returncode == 2 and not _pip_lines(log)
    assert "--line must be recipe" in r.stderr and "'nightly'" in r.stderr


def test_constraints_files_pin_what_library_lines_names():
    """constraints/<line>.txt and fastvideo.library_lines.LINES name the same versions."""
    from fastvideo.library_lines import LINES

    for name, spec in LINES.items():
        pins = install_plan.line_pins(name)
        for dist in ("diffusers", "transformers", "peft"):
            assert f"{dist}=={getattr(spec, dist)}" in pins, (name, dist, pins)
