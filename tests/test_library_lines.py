"""fastvideo/library_lines.py: the line of this environment and the library noise kept out of logs."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

from fastvideo import library_lines

ROOT = Path(__file__).resolve().parents[1]


def test_line_of_diffusers_versions():
    assert library_lines.line_of_diffusers("0.32.0") == "recipe"
    assert library_lines.line_of_diffusers("0.39.9") == "recipe"
    assert library_lines.line_of_diffusers("0.40.0") == "current"
    assert library_lines.line_of_diffusers("0.42.1") == "current"


def test_empty_float32_warning_is_dropped_and_others_kept():
    logger = logging.getLogger("diffusers.models.modeling_utils")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        library_lines.quiet_library_noise(io.StringIO())  # idempotent: one filter however often
        library_lines.quiet_library_noise(io.StringIO())
        logger.warning("There are modules in X that should be kept in float32: []. Casting directly ...")
        logger.warning("There are modules in X that should be kept in float32: ['norm']. Casting ...")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().splitlines() == ["There are modules in X that should be kept in float32: ['norm']. Casting ..."]
    assert sum(isinstance(f, library_lines._EmptyFp32ListWarning) for f in logger.filters) == 1


def test_progress_bars_off_a_terminal_unless_the_user_chose():
    code = "import os, fastvideo; print(os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert piped.stdout.strip() == "1"  # stderr is a pipe here: a log, not a terminal
    kept = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**env, "HF_HUB_DISABLE_PROGRESS_BARS": "0"})
    assert kept.stdout.strip() == "0"
