"""Evaluate and compare models on held-out prompts with the same noise.

    python -m fastvideo.tools.evaluate --model BASE_MODEL_DIR --model trained=OUTPUT_DIR/best \\
        --prompts assets/eval_prompts.txt --rewards hpsv2,pickscore,detail --out eval_out [--h 720 --w 720]

Each --model is a diffusers model folder, a training checkpoint folder (checkpoint-N, best; full or
LoRA), an exported transformer folder, or an exported LoRA (a folder with
pytorch_lora_weights.safetensors), optionally LABEL=PATH. The text encoders and VAE come from --base
(default: the first model folder among the models); LoRA models are merged into --base's transformer. The
model family is the one the checkpoints' runs record (OUTPUT_DIR/config.json), else --model_family
(default flux); a family's own flags (Wan's --num_frames) default to what the run recorded, else
the family's default. Every model sees the same initial noise per (prompt, image), drawn from
RandomSource(--seed) exactly as the training run's evaluation draws it.

A checkpoint's run (OUTPUT_DIR/config.json beside OUTPUT_DIR/checkpoint-N) gives the defaults of
the sampling flags, --seed, the batch, the prompts file, the rewards and the reward models' folders
(fastvideo.eval.run_defaults), so `--model OUTPUT_DIR/checkpoint-N --out DIR` alone scores what
the run's eval.jsonl recorded for iteration N; flags given override them.

Writes OUT/results.md and results.csv (per model and reward: mean, std, 95% CI, win rate against
the first model on the same noise, and the paired difference to it with its 95% Student
t-interval over prompts), OUT/scores.jsonl (every image's scores), OUT/grid_NN.png (one row per
model, the same prompts and noise side by side, each prompt above its column and each image's
scores under it), and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import torch

from fastvideo.errors import one_line_errors
from fastvideo.eval.models import (
    MODEL_FOLDER,
    ModelSpecError,
    family_name_for,
    load_transformer_for,
    parse_model_arg,
)


def build_parser() -> argparse.ArgumentParser:
    """Flags whose default reads "the run's" take it from the first checkpoint's run
    (OUTPUT_DIR/config.json, fastvideo.eval.run_defaults), else the value after "else"."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m fastvideo.tools.evaluate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, help="[LABEL=]PATH; repeat to compare (first = reference)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--prompts", default=None, help="prompts .txt (e.g. assets/eval_prompts.txt) or videos2caption.json "
                                                   "(default: the run's --eval_prompts)")
    p.add_argument("--rewards", default=None, help='comma-separated reward names, e.g. "hpsv2,pickscore,detail" '
                                                   "(default: the rewards the run's evaluation scored)")
    p.add_argument("--base", default=None,
                   help="model folder for the VAE and text encoders (default: the first model folder among --model, "
                        "else the checkpoint's run's --pretrained_model_name_or_path)")
    p.add_argument("--model_family", default=None,
                   help="model family (a registered name or pkg.module:Name) of models whose run records none "
                        "(default: the checkpoints' runs' family, else flux)")
    inherited = [
        ("--seed", int, "the run's --seed (its evaluation noise)"), ("--h", int, None), ("--w", int, None),
        ("--steps", int, "sampling steps"), ("--eta", float, "0: ODE sampling"), ("--shift", float, None),
        ("--guidance_scale", float, None), ("--num_images_per_prompt", int, None),
        ("--batch_size", int, "images per transformer call"),
        ("--max_sequence_length", int, "T5 length when encoding a .txt file"),
        ("--grid_prompts", int, "prompts per grid PNG"), ("--hps_ckpt_dir", str, None),
        ("--hps_model_name", str, None), ("--pickscore_dir", str, None), ("--pickscore_processor_dir", str, None),
        ("--clip_dir", str, None), ("--reward_batch_size", int, None)]
    for flag, kind, text in inherited:
        p.add_argument(flag, type=kind, default=None, help=_inherited_help(flag, text))
    p.add_argument("--no_quantize_timestep", action="store_true", default=None, help=_inherited_help(
        "--no_quantize_timestep", "pass the exact sigma to the transformer"))
    p.add_argument("--hps_input", choices=["uint8", "float"], default=None, help=_inherited_help("--hps_input", None))
    p.add_argument("--mixed_precision", choices=["no", "bf16"], default=None, help=_inherited_help(
        "--mixed_precision", "autocast for sampling on GPU/NPU (always fp32 on CPU)"))
    return one_line_errors(p)


def _inherited_help(flag: str, text: str | None) -> str:
    from fastvideo.eval.run_defaults import BUILTIN

    return (f"{text}; " if text else "") + f"default: the run's, else {BUILTIN[flag.lstrip('-')]}"


def _rewards(args, device) -> dict:
    from fastvideo.rewards.registry import build_reward

    per = {"hpsv2": {"hps_ckpt_dir": args.hps_ckpt_dir, "model_name": args.hps_model_name,
                     "input_precision": args.hps_input},
           "pickscore": {"pickscore_dir": args.pickscore_dir, "processor_dir": args.pickscore_processor_dir},
           "clip": {"clip_dir": args.clip_dir}, "clip_edit": {"clip_dir": args.clip_dir}}
    names = list(dict.fromkeys(n.strip() for n in args.rewards.split(",")))
    return {n: build_reward(n, device=device, batch_size=args.reward_batch_size, **per.get(n, {})) for n in names}


def _check(args, models, family) -> Path:
    from fastvideo.rewards.registry import check_reward_name

    for n in args.rewards.split(","):
        check_reward_name(n.strip())
    if args.h % 16 or args.w % 16 or min(args.h, args.w, args.steps, args.batch_size,
                                         args.num_images_per_prompt, args.grid_prompts) < 1:
        raise ValueError("--h/--w must be positive multiples of 16; --steps, --batch_size, "
                         "--num_images_per_prompt and --grid_prompts at least 1")
    import math

    if not (math.isfinite(args.eta) and args.eta >= 0):
        raise ValueError(f"--eta {args.eta} must be a finite number >= 0 (0: ODE sampling)")
    if not (math.isfinite(args.shift) and args.shift > 0) or not math.isfinite(args.guidance_scale):
        raise ValueError(f"--shift {args.shift} must be a finite number > 0 and --guidance_scale "
                         f"{args.guidance_scale} finite")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a file, not a folder")
    if args.base:
        if not Path(args.base).is_dir():
            raise ModelSpecError(f"--base {args.base!r} is not a folder")
        return Path(args.base)
    base = next((m.path for m in models if m.kind == MODEL_FOLDER), None)
    run_base = getattr(args, "run_base", None)  # the model folder the checkpoint's run trained from
    if base is None and run_base and Path(run_base).is_dir():
        base = Path(run_base)
    if base is None:
        gone = f" (the run's model folder {run_base!r} is gone)" if run_base else ""
        raise ModelSpecError(f"no {family.name} model folder among the models{gone}: pass --base MODEL_DIR for the "
                             "VAE and text encoders")
    return base


def _write(out: Path, labels, results, rows, table: str, grid_prompts: int, sources=None, fps=None) -> None:
    (out / "results.md").write_text(f"# Evaluation\n\n{table}", encoding="utf-8")
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(out / "scores.jsonl", "w", encoding="utf-8") as f:
        for label, res in zip(labels, results):
            for p, caption in enumerate(res.captions):
                for k in range(next(iter(res.scores.values())).shape[1]):
                    scores = {n: s[p, k].item() for n, s in res.scores.items()}
                    f.write(json.dumps({"model": label, "prompt": caption, "image": k, "scores": scores}) + "\n")
    _write_grids(out, labels, results, grid_prompts, sources, fps)


def _write_grids(out: Path, labels, results, grid_prompts: int, sources=None, fps=None) -> None:
    """OUT/grid_NN.png: grid_prompts prompts each, one row per model (image 0 of each prompt, its
    scores under it, the prompt above its column); editing (sources [P, 3, H', W']): the source
    images first, shown at the generated size (source | base | trained ...). A video family's
    clips: frame strips in the PNG, and OUT/grid_NN.mp4 (the models' clips, a row each, at fps)."""
    import torch.nn.functional as F

    from fastvideo.eval.grid import clip_grid_mp4, labelled_grid

    num = len(results[0].captions)
    size = tuple(results[0].grid.shape[-2:])
    for page, start in enumerate(range(0, num, grid_prompts)):
        cols = range(start, min(num, start + grid_prompts))
        rows = [(label, res.grid[start:start + grid_prompts],
                 [[f"{n} {s[p, 0].item():.4g}" for n, s in res.scores.items()] for p in cols])
                for label, res in zip(labels, results)]
        if sources is not None:
            shown = F.interpolate(sources[start:start + grid_prompts].float(), size=size, mode="bilinear")
            rows.insert(0, ("source", shown.clamp(0, 1), [[] for _ in cols]))
        labelled_grid(rows, results[0].captions[start:start + grid_prompts], out / f"grid_{page:02d}.png")
        clip_grid_mp4([images for _, images, _ in rows], out / f"grid_{page:02d}.mp4", fps)


def _settings(args, models) -> list[str]:
    """Fill the flags left unset from the first checkpoint's run (else the built-in defaults);
    the lines saying where they came from."""
    from fastvideo.eval.models import CHECKPOINT, LORA_CHECKPOINT
    from fastvideo.eval.run_defaults import resolve

    lines, run = resolve(args, [m.path for m in models if m.kind in (CHECKPOINT, LORA_CHECKPOINT)])
    args.run_base = run["model"].get("pretrained_model_name_or_path") if run else None
    args.run_plugins = (run.get("plugins") or {}) if run else {}
    missing = [flag for flag in ("prompts", "rewards") if getattr(args, flag) is None]
    if missing:  # every missing input named at once, with an example of each
        examples = {"prompts": "--prompts assets/eval_prompts.txt", "rewards": "--rewards hpsv2,detail"}
        raise ValueError(f"{' and '.join('--' + f for f in missing)} needed: no checkpoint among the models comes "
                         f"from a run that evaluated with --eval_{missing[0]} (pass "
                         f"{' '.join(examples[f] for f in missing)}, for example)")
    return lines


def run(args) -> str:
    from fastvideo import devices
    from fastvideo.eval.core import SampleSettings, evaluate
    from fastvideo.eval.prompts import load_eval_prompts
    from fastvideo.eval.stats import markdown_table, table_rows
    from fastvideo.models.registry import get_model_family
    from fastvideo.sampling.randomness import RandomSource

    models = [parse_model_arg(m, _family_label(args.model_family)) for m in args.model]
    for line in _settings(args, models):
        print(line, flush=True)
    name = family_name_for(models, args.model_family)
    family = get_model_family(name, guidance_scale=args.guidance_scale, quantize_timestep=not args.no_quantize_timestep,
                              **_family_settings(name, args))
    base = _check(args, models, family)
    device = devices.get_device()
    amp = torch.bfloat16 if args.mixed_precision == "bf16" and devices.is_accelerator(device) else None
    prompts = load_eval_prompts(args.prompts, str(base), args.max_sequence_length, device, family=family)
    vae = family.load_vae(base, device=device, dtype=torch.float32)
    rewards = _rewards(args, device)
    s = SampleSettings(height=args.h, width=args.w, steps=args.steps, eta=args.eta, shift=args.shift,
                       batch_size=args.batch_size, num_images_per_prompt=args.num_images_per_prompt,
                       terminal=family.schedule_terminal())
    results = []
    for m in models:
        print(f"[evaluate] {m.label}: {m.kind} {m.path}", flush=True)
        model = load_transformer_for(m, base, device, family)
        results.append(evaluate(model, vae, prompts, rewards, RandomSource(args.seed), s, device, amp,
                                grid_prompts=len(prompts), progress=True, family=family))
        del model
    labels = [m.label for m in models]
    if len(set(labels)) != len(labels):
        labels = [f"{i}:{label}" for i, label in enumerate(labels)]
    rows = table_rows(labels, [r.scores for r in results])
    table = markdown_table(rows, labels[0])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write(out, labels, results, rows, table, args.grid_prompts, family.source_images(prompts.cond),
           getattr(family, "video_fps", None))
    return table


def _family_settings(name: str, args) -> dict:
    """{"settings": ...} of a family with settings of its own (Wan's --num_frames): each flag as given
    on the command line, else as the checkpoints' run recorded it (config.json's section), else the
    family's default; {} for a family without (its flags are then unknown: one line, exit 2)."""
    from fastvideo.components import family_factory_settings

    cls = family_factory_settings(name)
    extra = getattr(args, "family_argv", [])
    if cls is None:
        if extra:
            raise ValueError(f"unrecognized arguments: {' '.join(extra)} (model family {name} has no flags of its own)")
        return {}
    p = one_line_errors(argparse.ArgumentParser(prog="python -m fastvideo.tools.evaluate", allow_abbrev=False,
                                                add_help=False))
    cls.add_flags(p)
    recorded = getattr(args, "run_plugins", {}).get(cls.section)
    if isinstance(recorded, dict):
        p.set_defaults(**cls.flags_from_resolved(recorded))
    settings = cls.from_args(p.parse_args(extra))
    print(f"[evaluate] {name} settings: " + ", ".join(f"{k} {v}" for k, v in vars(settings).items()), flush=True)
    return {"settings": settings}


def _family_label(flag: str | None) -> str:
    """How messages name the base folder's family: FLUX for --model_family flux."""
    from fastvideo.models.registry import DEFAULT_FAMILY

    name = flag or DEFAULT_FAMILY
    return name if ":" in name else name.upper()


def main(argv: list[str] | None = None) -> int:
    from fastvideo.errors import report_failure
    from fastvideo.models.registry import UnknownModelFamilyError

    parser = build_parser()
    # What the evaluator's own flags leave: the model family's flags (Wan's --num_frames), read once
    # the family is known (_family_settings).
    args, args.family_argv = parser.parse_known_args(argv)
    try:
        table = run(args)
    except UnknownModelFamilyError as exc:  # one line: the name and the valid ones
        raise SystemExit(report_failure(exc, "evaluate")) from None
    except (ModelSpecError, ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    print(table)
    print(f"[evaluate] wrote {args.out}/results.md, results.csv, scores.jsonl and grid_*.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
