"""Preprocessing is checked once before torchrun starts its ranks, under its own name (issue #52
item 3: it "fails only after torchrun starts, once per rank, naming the wrong program")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_preprocessing_problems_are_reported_once_before_any_rank(tmp_path):
    env = dict(os.environ, FASTVIDEO_DEVICE="cpu", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=2",
           "fastvideo/data_preprocess/preprocess_embeddings.py", "--model_path", str(tmp_path / "no_model"),
           "--prompt_dir", str(tmp_path / "no_prompts.txt"), "--output_dir", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("preprocess_embeddings: error: --model_path") and "MODEL_PATH" in lines[0]
    assert lines[1].startswith("preprocess_embeddings: error: prompt file") and "no_prompts.txt" in lines[1]
    assert lines[2].startswith("preprocess_embeddings: 2 problems found before starting 2 rank(s); no worker")
    assert len(lines) == 3 and "train_grpo_flux" not in proc.stderr and "+ torchrun" not in proc.stderr
    assert not (tmp_path / "out").exists()
