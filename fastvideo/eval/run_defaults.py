"""The evaluator's defaults taken from the training run of a checkpoint.

A checkpoint OUTPUT_DIR/checkpoint-N (or OUTPUT_DIR/best) has its run's resolved configuration
beside it, OUTPUT_DIR/config.json. Its sampling settings (size, steps, eta, shift, guidance,
timestep quantisation), seed, evaluation batch and images per prompt, the T5 length of its
held-out prompts, their file, the rewards scored and the reward models' folders become the
evaluator's defaults, so that `evaluate --model OUTPUT_DIR/checkpoint-N --out DIR` samples the
same images with the same noise as the run's own evaluation recorded in eval.jsonl. A flag given
on the command line still wins; with no run (a model folder, an exported model) the built-in
defaults (BUILTIN) apply.
"""

from __future__ import annotations

import json
from pathlib import Path

# The evaluator's own defaults, where no run says otherwise (flag dest -> value).
BUILTIN = {
    "h": 720, "w": 720, "steps": 16, "eta": 0.0, "shift": 3.0, "guidance_scale": 3.5, "no_quantize_timestep": False,
    "seed": 42, "batch_size": 1, "num_images_per_prompt": 1, "max_sequence_length": 512, "grid_prompts": 8,
    "mixed_precision": "bf16", "hps_ckpt_dir": "./hps_ckpt", "hps_model_name": "ViT-H-14", "hps_input": "uint8",
    "pickscore_dir": "./pickscore_ckpt", "pickscore_processor_dir": None, "clip_dir": "./clip_ckpt",
    "reward_batch_size": 8, "prompts": None, "rewards": None,
}


def run_config(checkpoint: Path) -> tuple[Path, dict] | None:
    """(path, resolved configuration) of the run a checkpoint folder belongs to, or None when
    its parent holds no run's config.json (a model folder, an exported model, a moved checkpoint)."""
    path = Path(checkpoint).parent / "config.json"
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    ok = isinstance(run, dict) and all(isinstance(run.get(k), dict) for k in ("model", "rollout", "optim", "reward"))
    return (path, run) if ok else None


def _training_text_length(run: dict) -> int | None:
    """The T5 length of the run's training embeddings (what its evaluation encodes a .txt file
    with when --eval_max_sequence_length is unset); None when the embeddings cannot be read."""
    from fastvideo.data.dataset import PromptEmbeddingDataset
    from fastvideo.errors import UserError
    from fastvideo.models.registry import UNRECORDED_RUN_FAMILY, get_model_family

    try:
        family = get_model_family(run["model"].get("family", UNRECORDED_RUN_FAMILY))
        return int(PromptEmbeddingDataset(run["data_json_path"], family=family).dims()[0])
    except (UserError, OSError, ValueError, KeyError, TypeError):  # moved or deleted: the default applies
        return None


def defaults_from_run(run: dict) -> dict:
    """{evaluator flag dest: value} from a run's resolved configuration (OUTPUT_DIR/config.json).
    With the run's evaluation off, sampling follows its rollout (steps, batch) and prompts and
    rewards are left to the command line."""
    r, o, m, rw = run["rollout"], run["optim"], run["model"], run["reward"]
    out = {"h": r["height"], "w": r["width"], "shift": r["shift"], "guidance_scale": r["guidance_scale"],
           "no_quantize_timestep": not r["quantize_timestep"], "seed": o["seed"], "steps": r["sampling_steps"],
           "batch_size": r["rollout_batch_size"],
           **{k: rw[k] for k in ("hps_ckpt_dir", "hps_model_name", "hps_input", "pickscore_dir",
                                 "pickscore_processor_dir", "clip_dir") if k in rw},
           "reward_batch_size": rw.get("batch_size", BUILTIN["reward_batch_size"])}
    if m.get("mixed_precision") in ("no", "bf16"):
        out["mixed_precision"] = m["mixed_precision"]
    e = run.get("eval")
    if isinstance(e, dict):
        out.update(steps=e["steps"], eta=e["eta"], batch_size=e["batch_size"],
                   num_images_per_prompt=e["num_images_per_prompt"], grid_prompts=e["grid_prompts"],
                   prompts=e["prompts"], rewards=",".join(e["rewards"]))
        length = e.get("max_sequence_length") or _training_text_length(run)
        if length:
            out["max_sequence_length"] = length
    return out


def resolve(args, checkpoints: list[Path]) -> tuple[list[str], dict | None]:
    """Fill every evaluator flag left unset (None) in ``args``: from the first checkpoint's run,
    else BUILTIN. Returns the lines to print (where the defaults came from, and the settings on
    which the other checkpoints' runs differ: the first run's are used) and that run (or None)."""
    runs = [found for found in map(run_config, checkpoints) if found is not None]
    inherited = defaults_from_run(runs[0][1]) if runs else {}
    taken = {}
    for dest, value in BUILTIN.items():
        if getattr(args, dest) is None:
            setattr(args, dest, inherited.get(dest, value))
            if dest in inherited:
                taken[dest] = inherited[dest]
    if not runs:
        return [], None
    lines = [f"[evaluate] defaults from {runs[0][0]}: " + ", ".join(f"{k} {v}" for k, v in taken.items())
             + " (flags given override them)"]
    for path, run in runs[1:]:
        other = defaults_from_run(run)
        differ = [k for k in taken if k in other and other[k] != taken[k]]
        if differ:
            lines.append(f"[evaluate] {path} differs on {', '.join(differ)}: the first run's values are used")
    return lines, runs[0][1]
