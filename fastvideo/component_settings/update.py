"""The update's settings: how the shared update loop (training/update.py) cuts an iteration's work
into micro-batches and how many of them one optimizer step accumulates. Generic: every objective
plans its micro-batches of this size (ObjectiveContext.update)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, at_least_one, flag_group

_FLAGS = ("train_micro_batch_size", "gradient_accumulation_steps")
GRAD_SYNC = ("per_microbatch", "per_step")
ALL = 0  # --update_timesteps_per_forward all: every trained timestep of a micro-batch in one forward


def timesteps_value(text) -> int:
    """--update_timesteps_per_forward: a positive integer K, or "all" (stored as ALL, 0)."""
    if str(text).strip().lower() == "all":
        return ALL
    try:
        k = int(text)
    except ValueError:
        k = -1
    if k < 1:
        raise ConfigError(f"--update_timesteps_per_forward {text!r} is neither a positive number of timesteps nor "
                          "'all'; give e.g. 4 or all")
    return k


@dataclass
class UpdateSettings(Settings):
    train_micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    # (sample, timestep) terms stacked along the batch of one forward + backward: K, or ALL (0)
    timesteps_per_forward: int = 1
    # when the gradients are reduce-scattered: per_microbatch (every backward) | per_step (once per
    # optimizer step: the accumulation window's backwards under FSDP's no_sync, unsharded gradients held)
    grad_sync: str = "per_microbatch"

    section = "update"

    def stack(self, trained_steps: int) -> int:
        """Timesteps one forward covers for ``trained_steps`` per sample (ALL -> all of them)."""
        k = self.timesteps_per_forward
        return trained_steps if k == ALL else max(1, min(k, trained_steps))

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "optimisation")
        g.add_argument("--train_micro_batch_size", type=int, default=1, help="samples per micro-batch in the update")
        g.add_argument("--gradient_accumulation_steps", type=int, default=1, help="micro-batches per optimizer step")
        g.add_argument("--update_timesteps_per_forward", type=str, default="1", metavar="K|all",
                       help="batched timestep replay: one forward + backward covers K trained timesteps of a "
                            "micro-batch's samples, stacked along the batch (the same loss; FSDP gathers the "
                            "weights and reduce-scatters the gradients once per K timesteps instead of each); "
                            "all: every trained timestep (refused where the memory model says it will not fit)")
        g.add_argument("--grad_sync", type=str, default="per_microbatch", choices=list(GRAD_SYNC),
                       help="per_step: reduce-scatter the gradients once per optimizer step (FSDP's no_sync over "
                            "the accumulation window; holds the whole unsharded fp32 gradients, priced by the "
                            "memory model and refused where they would not fit); per_microbatch: after every "
                            "backward (default)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "UpdateSettings":
        at_least_one(args, *_FLAGS)
        return cls(train_micro_batch_size=args.train_micro_batch_size,
                   gradient_accumulation_steps=args.gradient_accumulation_steps,
                   timesteps_per_forward=timesteps_value(args.update_timesteps_per_forward),
                   grad_sync=args.grad_sync).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        # A config.json from before this section held the two in "grpo"; then section is the whole file.
        if "train_micro_batch_size" not in section:
            section = section.get("grpo", {})
        flags = {k: section[k] for k in _FLAGS if k in section}
        k = section.get("timesteps_per_forward", 1)
        flags["update_timesteps_per_forward"] = "all" if k == ALL else str(k)
        flags["grad_sync"] = section.get("grad_sync", "per_microbatch")
        return flags
