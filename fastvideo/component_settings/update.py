"""The update's settings: how the shared update loop (training/update.py) cuts an iteration's work
into micro-batches and how many of them one optimizer step accumulates. Generic: every objective
plans its micro-batches of this size (ObjectiveContext.update)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.settings import Settings, at_least_one, flag_group

_FLAGS = ("train_micro_batch_size", "gradient_accumulation_steps")


@dataclass
class UpdateSettings(Settings):
    train_micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1

    section = "update"

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "optimisation")
        g.add_argument("--train_micro_batch_size", type=int, default=1, help="samples per micro-batch in the update")
        g.add_argument("--gradient_accumulation_steps", type=int, default=1, help="micro-batches per optimizer step")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "UpdateSettings":
        at_least_one(args, *_FLAGS)
        return cls(train_micro_batch_size=args.train_micro_batch_size,
                   gradient_accumulation_steps=args.gradient_accumulation_steps).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        # A config.json from before this section held the two in "grpo"; then section is the whole file.
        if "train_micro_batch_size" not in section:
            section = section.get("grpo", {})
        return {k: section[k] for k in _FLAGS if k in section}
