"""Shared by the env_setup.sh tests: a fresh venv without pip, stand-in modules for the final import
check, and a pip stand-in that records each command instead of installing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture()
def env(tmp_path):
    """(venv dir, environment, pip log) for a run of env_setup.sh."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.check_output([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    fake_mods = tmp_path / "mods"
    fake_mods.mkdir()
    (fake_mods / "torch_npu.py").write_text(
        "import os\nif 'FAKE_CANN_SOURCED' not in os.environ:\n    raise ImportError('libhccl.so: cannot open shared object file')\n")
    for name in ("fastvideo", "torch", "diffusers", "transformers", "open_clip"):
        (fake_mods / f"{name}.py").write_text("__version__ = 'stand-in'\n")
    (site / "standins.pth").write_text(f"{fake_mods}\n")
    log = tmp_path / "pip.log"
    pip = tmp_path / "pip_standin.sh"
    # pip.log: one line per command; pip.log.args: the same with each argument bracketed ([] = empty).
    pip.write_text(f'#!/bin/sh\necho "$*" >> {log}\nprintf "[%s]" "$@" >> {log}.args\necho >> {log}.args\n')
    pip.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "CONDA", "PIP_", "PYTHONPATH"))}
    driver = tmp_path / "driver"
    (driver / "lib64").mkdir(parents=True)  # an NPU host's driver: env_setup.sh then imports torch_npu
    e.update(FLUX_GRPO_PIP=str(pip), ASCEND_TOOLKIT_HOME="", ASCEND_HOME_PATH="", ASCEND_DRIVER_HOME=str(driver))
    e.pop("CANN_SET_ENV", None)
    e.pop("LINE", None)  # CI runs the current line's suite with LINE=current; env_setup.sh's default reads it
    return venv, e, log
