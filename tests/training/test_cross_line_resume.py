"""A checkpoint written on one library line resumes on the other (recipe: diffusers 0.32 / transformers
4.46; current: diffusers 0.42 / transformers 5).

The other line's environment writes a 2-rank checkpoint of the tiny FLUX; this line resumes it with
learning rate 0 for one more iteration. The checkpoint the resumed run writes must hold exactly the
weights it loaded (bit for bit: names and tensors read across lines), its optimizer must continue the
saved one (Adam's step 2, not 1), and the start-up names both lines.

Runs where both environments exist: in CI the recipe line's suite runs first, so the current line's
suite runs this test against a recipe-line checkpoint. FLUX_GRPO_OTHER_LINE_PYTHON names the other
line's interpreter explicitly.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from safetensors.torch import load_file

from fastvideo.library_lines import CURRENT, RECIPE, library_line
from helpers import ROOT, python_path, read_metrics, torchrun, train_args

pytestmark = pytest.mark.slow
OTHER_VENV = {RECIPE: ".venv-current", CURRENT: ".venv"}


def _line_of(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "from fastvideo.library_lines import library_line; print(library_line())"],
                             capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _other_line_python() -> tuple[str, str]:
    here = library_line()
    python = os.environ.get("FLUX_GRPO_OTHER_LINE_PYTHON") or str(ROOT / OTHER_VENV[here] / "bin" / "python")
    line = _line_of(python)
    if line is None or line == here:
        pytest.skip(f"needs the other library line's environment ({OTHER_VENV[here]}: bash env_setup.sh --line "
                    f"{CURRENT if here == RECIPE else RECIPE}); CI's second line runs this test")
    return python, line


def _adam_step(checkpoint) -> float:
    from fastvideo.training.checkpoint.state_io import load_tree

    state = load_tree(checkpoint, "optimizer")["state"]
    return float(next(iter(state.values()))["step"])


def test_checkpoint_of_the_other_line_resumes_here(tiny_flux_dir, tiny_embeddings, tmp_path):
    python, other = _other_line_python()
    out = tmp_path / "run"
    first = train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=1, checkpointing_steps=1,
                       save_images_every=0)
    env = dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=python_path(ROOT))
    r = subprocess.run([python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(ROOT / "fastvideo" / "train_grpo_flux.py"), *first],
                       capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    saved = out / "checkpoint-1"
    assert json.loads((saved / "meta.json").read_text())["library_line"] == other

    second = train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=2, checkpointing_steps=1,
                        save_images_every=0, learning_rate=0.0, resume_from_checkpoint="latest",
                        resume_allow_changes=True)
    r = torchrun(second, nproc=2, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"was written on the {other} line" in r.stdout + r.stderr
    assert f"read on the {library_line()} line" in r.stdout + r.stderr
    resumed = out / "checkpoint-2"
    assert json.loads((resumed / "meta.json").read_text())["library_line"] == library_line()
    before = load_file(str(saved / "diffusion_pytorch_model.safetensors"))
    after = load_file(str(resumed / "diffusion_pytorch_model.safetensors"))
    assert before.keys() == after.keys()
    assert all(before[k].equal(after[k]) for k in before), "lr 0 after resume changed the loaded weights"
    assert _adam_step(saved) == 1.0 and _adam_step(resumed) == 2.0
    assert [m["iteration"] for m in read_metrics(out)][-1] == 2
