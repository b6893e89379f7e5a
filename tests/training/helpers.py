"""Shared helpers for trainer tests: flag lists and torchrun launches on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train_args(json_path, model_dir, out_dir, **overrides) -> list[str]:
    """A small, fast fp32 configuration on the tiny model; overrides replace or add flags
    (True -> bare flag, None -> removed)."""
    flags = {
        "data_json_path": str(json_path),
        "pretrained_model_name_or_path": str(model_dir),
        "output_dir": str(out_dir),
        "rewards": "compressibility:1.0",
        "h": 32, "w": 32,
        "sampling_steps": 4,
        "eta": 0.5,
        "shift": 3,
        "num_generations": 2,
        "train_batch_size": 1,
        "rollout_batch_size": 2,
        "train_micro_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "timestep_fraction": 0.5,
        "learning_rate": 1e-3,
        "max_grad_norm": 1.0,
        "mixed_precision": "no",
        "max_train_steps": 2,
        "checkpointing_steps": 2,
        "save_images_every": 1,
        "dataloader_num_workers": 0,
        "seed": 7,
        "use_group": True,
        "ignore_last": True,
    }
    flags.update(overrides)
    argv = []
    for k, v in flags.items():
        if v is None or v is False:
            continue
        argv.append(f"--{k}")
        if v is not True:
            argv.append(str(v))
    return argv


def python_path(*first) -> str:
    """PYTHONPATH for a child: ``first`` ahead of the test session's own (which carries
    tests/hccl_site, so the child checks its collectives against HCCL's rules)."""
    return os.pathsep.join([*(str(p) for p in first), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


def torchrun(argv: list[str], nproc: int = 2, timeout: int = 300,
             script: str = "train_grpo_flux.py", real: bool = False) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=nproc fastvideo/<script> argv`` on CPU. By default the ranks are
    forked from this process (tests/fork_launch.py: the same entry point without ~7 s of imports
    per rank); ``real=True`` or FLUX_GRPO_TEST_REAL_TORCHRUN=1 starts the real torchrun."""
    env = dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=python_path(ROOT))
    # Forked ranks run a fastvideo/<script> entry point's main(); any other script (a path) gets torchrun.
    forkable = "/" not in script and hasattr(os, "fork")
    if not real and forkable and os.environ.get("FLUX_GRPO_TEST_REAL_TORCHRUN", "0") != "1":
        from fork_launch import fork_torchrun

        return fork_torchrun(argv, env, nproc=nproc, timeout=timeout, script=script, cwd=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(ROOT / "fastvideo" / script), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def read_metrics(out_dir) -> list[dict]:
    path = Path(out_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def single_process_trainer(argv: list[str], monkeypatch):
    """A set-up trainer with its hooks in this process (one CPU rank, no torchrun environment)."""
    from fastvideo import devices
    from fastvideo.config import parse_config
    from fastvideo.train_grpo_flux import build_trainer

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    return build_trainer(parse_config(argv), devices.init_distributed())


def to_old_layout(path) -> None:
    """Rewrite a checkpoint folder in place in the layout written before upstream's names:
    model.safetensors, lora.safetensors (peft names), transformer_config.json, and a COMPLETE.json
    with sizes only (no digests)."""
    from safetensors.torch import save_file

    from fastvideo.training.checkpoint import files

    path = Path(path)
    if (path / files.LORA_FILE).is_file():
        save_file(files.read_weights(path, lora=True), str(path / "lora.safetensors"))
        (path / files.LORA_FILE).unlink()
    for new, old in ((files.MODEL_FILE, "model.safetensors"), (files.CONFIG_FILE, "transformer_config.json")):
        if (path / new).is_file():
            os.replace(path / new, path / old)
    marker = json.loads((path / files.MARKER).read_text())
    sizes = {p.relative_to(path).as_posix(): p.stat().st_size for p in sorted(path.rglob("*"))
             if p.is_file() and p.name != files.MARKER}
    (path / files.MARKER).write_text(json.dumps({"format_version": 1, "iteration": marker["iteration"],
                                                 "files": sizes}))


def flip_bit(path, offset_from_end: int = 1) -> None:
    """Flip one bit of a file in place (same size): the damage a size check cannot see."""
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, os.SEEK_END)
        byte = f.read(1)
        f.seek(-offset_from_end, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x10]))


def run_and_resume(root, json_path, model_dir, **flags):
    """Two 2-rank runs of ``flags`` (train_args' overrides, with checkpointing_steps 1): straight
    to the end, and resumed from the first's checkpoint-1 -> (straight dir, resumed dir)."""
    root = Path(root)
    straight, resumed = root / "straight", root / "resumed"
    for out, extra in ((straight, {}), (resumed, {"resume_from_checkpoint": str(straight / "checkpoint-1")})):
        proc = torchrun(train_args(json_path, model_dir, out, **flags, **extra))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return straight, resumed


def same_checkpoint_file(a, b, name: str = "diffusion_pytorch_model.safetensors") -> bool:
    """Whether checkpoint folders a and b hold the same tensors, bit for bit, in file ``name``."""
    import torch
    from safetensors.torch import load_file

    x, y = load_file(str(Path(a) / name)), load_file(str(Path(b) / name))
    return bool(x) and set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)


def resumed_metrics(straight, resumed, keys) -> list[dict]:
    """run_and_resume's metrics: the straight run's rows of iterations 1, 2, after checking the
    resumed run logged iteration 2 alone with ``keys`` equal, bit for bit."""
    rows, again = read_metrics(straight), read_metrics(resumed)
    assert [r["iteration"] for r in rows] == [1, 2] and [r["iteration"] for r in again] == [2]
    for key in keys:
        assert rows[1][key] == again[0][key], (key, rows[1][key], again[0][key])
    return rows
