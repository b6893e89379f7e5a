"""Output settings: where checkpoints, images and metrics go, how often, resuming, and the
alignment recordings (--record_dir, randomness capture/replay, module probes)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, at_least_one, flag_group

def check_writable_folder(flag: str, folder: str | None) -> None:
    """A folder the run will write: refused when it is a file, or it (or, not yet made, its nearest
    existing parent) is not a writable folder -- found now, not at the first checkpoint."""
    if not folder:
        return
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--{flag} {folder} is a file, not a folder: choose a folder for the run's outputs")
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--{flag} {folder}: {probe} is a file, so the folder cannot be made")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--{flag} {folder}: {probe} is not writable by this user; choose another folder")


# The module kinds whose outputs --probe_layers records (fastvideo/alignment/probes.py reads them here).
PROBE_KINDS = ("rope", "norm", "attention", "block", "vae")


def _probe_kinds(text: str | None) -> list[str] | None:
    if not text:
        return None
    kinds = list(PROBE_KINDS) if text == "all" else [s.strip() for s in text.split(",")]
    bad = [s for s in kinds if s not in PROBE_KINDS]
    if bad:
        raise ConfigError(f"--probe_layers: unknown kind(s) {bad}; valid: all or {', '.join(PROBE_KINDS)}")
    return kinds


@dataclass
class OutputSettings(Settings):
    output_dir: str
    image_dir: str
    checkpointing_steps: int
    checkpoints_total_limit: int
    resume_from_checkpoint: str | None
    resume_allow_changes: bool
    save_images_every: int
    report_to: str
    record_dir: str | None
    record_tensors: bool
    dump_randomness: str | None
    load_randomness: str | None
    probe_layers: list[str] | None
    log_every: int = 1
    overwrite: bool = False  # an action on the folder, not a setting: never replayed from a config.json
    checkpoint_on_signal: bool = True
    checkpoint_format: str = "gathered"  # gathered | sharded (training/checkpoint/shards.py)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "outputs")
        g.add_argument("--output_dir", type=str, default="data/outputs/grpo",
                       help="checkpoints, config.json, metrics.jsonl and images go here")
        g.add_argument("--checkpointing_steps", type=int, default=40, help="write a checkpoint every N iterations")
        g.add_argument("--checkpoints_total_limit", type=int, default=3, help="keep the last K checkpoints")
        g.add_argument("--checkpoint_format", type=str, default="gathered", choices=["gathered", "sharded"],
                       help="gathered: optimizer state and EMA gathered on rank 0 into whole files; sharded: each "
                            "rank writes its own shard of them at once (re-sharded on load to any world size), the "
                            "model file gathered one FSDP unit at a time. Either resumes on any world size")
        g.add_argument("--resume_from_checkpoint", type=str, default=None, help='"latest" or a checkpoint folder')
        g.add_argument("--image_dir", type=str, default=None,
                       help="folder under which images/step_NNNNNN/ is written (default OUTPUT_DIR)")
        g.add_argument("--save_images_every", type=int, default=1,
                       help="save rollout images every N iterations (0: never)")
        g.add_argument("--report_to", type=str, default="none", choices=["none", "wandb", "tensorboard"],
                       help="also log metrics to wandb, or as TensorBoard scalars under OUTPUT_DIR/tensorboard "
                            "(metrics.jsonl is always written)")
        g.add_argument("--log_every", type=int, default=1,
                       help="print one text line of metrics (reward, loss, grad norm, KL, clip fraction, "
                            "s/iteration, ETA) every N iterations on rank 0, for batch-job logs (0: never)")
        g.add_argument("--overwrite", action="store_true",
                       help="clear what an earlier run wrote in --output_dir (checkpoints, metrics, images, "
                            "evaluation files; nothing else) instead of refusing a non-empty folder")
        g.add_argument("--no_checkpoint_on_signal", action="store_true",
                       help="on SIGTERM / SIGINT stop after the current iteration without writing a checkpoint "
                            "(default: write one and print the resume command)")
        g = flag_group(parser, "alignment")
        g.add_argument("--record_dir", type=str, default=None, help="record a run for compare_runs")
        g.add_argument("--record_tensors", action="store_true",
                       help="also record initial noise and sample-0 latents")
        g.add_argument("--dump_randomness", type=str, default=None, help="capture every random draw to DIR")
        g.add_argument("--load_randomness", type=str, default=None, help="replay random draws from DIR")
        g.add_argument("--resume_allow_changes", action="store_true",
                       help="resume even if the run-defining settings (seed, group size, schedule, rewards, "
                            "batch layout ...) differ from the checkpoint's; the differences are logged")
        g.add_argument("--probe_layers", type=str, default=None,
                       help='record module outputs for one fixed input: "all" or comma-separated kinds '
                            "(rope,norm,attention,block,vae)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "OutputSettings":
        at_least_one(args, "checkpointing_steps")
        if args.report_to == "tensorboard":
            import importlib.util

            if importlib.util.find_spec("tensorboard") is None:
                raise ConfigError("--report_to tensorboard needs the tensorboard package, which this environment "
                                  "lacks: pip install tensorboard (or --report_to wandb / none)")
        return cls(
            output_dir=args.output_dir,
            image_dir=args.image_dir or args.output_dir,
            checkpointing_steps=args.checkpointing_steps,
            checkpoints_total_limit=args.checkpoints_total_limit,
            resume_from_checkpoint=args.resume_from_checkpoint,
            resume_allow_changes=args.resume_allow_changes,
            save_images_every=args.save_images_every,
            report_to=args.report_to,
            record_dir=args.record_dir,
            record_tensors=args.record_tensors,
            dump_randomness=args.dump_randomness,
            load_randomness=args.load_randomness,
            probe_layers=_probe_kinds(args.probe_layers),
            log_every=args.log_every,
            overwrite=args.overwrite,
            checkpoint_on_signal=not args.no_checkpoint_on_signal,
            checkpoint_format=args.checkpoint_format,
        ).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        kinds = section["probe_layers"]
        # image_dir as given: None when it is OUTPUT_DIR, so that a new --output_dir moves the images too.
        image_dir = None if section["image_dir"] == section["output_dir"] else section["image_dir"]
        flags = {**section, "probe_layers": ",".join(kinds) if kinds else None, "image_dir": image_dir}
        flags["overwrite"] = False  # replaying a run's config.json must not clear its folder
        flags["no_checkpoint_on_signal"] = not flags.pop("checkpoint_on_signal", True)
        flags.setdefault("checkpoint_format", "gathered")  # a config.json from before the flag
        return flags

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        if args.overwrite and args.resume_from_checkpoint:
            return ["--overwrite has no effect with --resume_from_checkpoint: the run continues in its folder"]
        return []

    def check(self) -> None:
        if self.dump_randomness and self.load_randomness:
            raise ConfigError("--dump_randomness and --load_randomness cannot be used together")
        if self.checkpoints_total_limit < 1:
            raise ConfigError("--checkpoints_total_limit must be at least 1")
        if self.log_every < 0:
            raise ConfigError(f"--log_every {self.log_every} must be >= 0 (0: no text lines)")
        if self.record_tensors and not self.record_dir:
            raise ConfigError("--record_tensors needs --record_dir")
        if self.probe_layers and not self.record_dir:
            raise ConfigError("--probe_layers needs --record_dir (probe outputs are written there)")
        for flag, folder in (("output_dir", self.output_dir), ("image_dir", self.image_dir)):
            check_writable_folder(flag, folder)
