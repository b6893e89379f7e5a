import sys
from pathlib import Path

import pytest

# The trainer tests' helpers (train_args, torchrun, read_metrics).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def eval_prompt_file(tmp_path_factory):
    """Six held-out prompts (the first lines of assets/eval_prompts.txt)."""
    lines = (ROOT / "assets" / "eval_prompts.txt").read_text(encoding="utf-8").splitlines()
    path = tmp_path_factory.mktemp("eval_prompts") / "eval6.txt"
    path.write_text("\n".join(lines[:3] + lines[16:17] + lines[32:33] + lines[48:49]) + "\n", encoding="utf-8")
    return path
