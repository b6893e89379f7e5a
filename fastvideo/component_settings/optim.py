"""Optimiser settings: seeds, iterations, AdamW, the learning-rate schedule, EMA, and the
non-finite-step guard. The optimiser is built in fastvideo/training/builders.py."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, at_least_one, check_number, flag_group


@dataclass
class OptimSettings(Settings):
    seed: int
    sampler_seed: int
    max_train_steps: int
    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    lr_scheduler: str
    lr_warmup_steps: int
    lr_num_cycles: int
    lr_power: float
    use_ema: bool
    ema_decay: float
    ema_start_step: int
    max_nonfinite_steps: int
    ema_update_interval: int = 1  # the EMA updates after every this many iterations (Flow-Factory's)
    adamw_kernel: str = "auto"
    ema_warmup: bool = False  # min((1 + s) / (10 + s), ema_decay) at optimizer step s (Flow-GRPO, DiffusionNFT)
    export_ema: bool = False  # tools/export exports this run's EMA weights unless told --policy (DiffusionNFT)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        flag_group(parser, "data").add_argument("--sampler_seed", type=int, default=None,
                                                help="seed of the prompt order (default: --seed)")
        g = flag_group(parser, "optimisation")
        g.add_argument("--seed", type=int, default=42, help="seed of the initial noise, the SDE noise and the weights")
        g.add_argument("--max_train_steps", type=int, default=300, help="GRPO iterations")
        g.add_argument("--learning_rate", type=float, default=1e-5, help="AdamW learning rate")
        g.add_argument("--weight_decay", type=float, default=1e-4, help="AdamW weight decay")
        g.add_argument("--max_grad_norm", type=float, default=1.0, help="gradient clipping norm")
        g.add_argument("--lr_scheduler", type=str, default="constant_with_warmup",
                       help="a diffusers learning-rate schedule (constant, constant_with_warmup, linear, cosine, ...)")
        g.add_argument("--lr_warmup_steps", type=int, default=0, help="warm-up optimizer steps of the schedule")
        g.add_argument("--lr_num_cycles", type=int, default=1, help="cycles of cosine_with_restarts")
        g.add_argument("--lr_power", type=float, default=1.0, help="power of the polynomial schedule")
        g.add_argument("--use_ema", action="store_true", help="keep an exponential moving average of the weights")
        g.add_argument("--ema_decay", type=float, default=0.995, help="EMA decay per optimizer step")
        g.add_argument("--ema_start_step", type=int, default=0, help="optimizer step from which the EMA updates")
        g.add_argument("--ema_update_interval", type=int, default=1,
                       help="update the EMA after every N-th iteration only (Flow-Factory's ema_update_interval, "
                            "EMAModuleWrapper.step: its DGPO recipe 8, with --ema_decay 0.9)")
        g.add_argument("--ema_warmup", action="store_true",
                       help="warm the EMA decay up: min((1 + s) / (10 + s), --ema_decay) after s optimizer steps "
                            "(Flow-GRPO's and DiffusionNFT's EMAModuleWrapper); default: --ema_decay from the start")
        g.add_argument("--export_ema", action="store_true",
                       help="this run's checkpoints export as their EMA weights (python -m fastvideo.tools.export "
                            "without --ema or --policy), as DiffusionNFT saves the EMA as its checkpoint")
        g.add_argument("--max_nonfinite_steps", type=int, default=3,
                       help="abort after this many iterations in a row with a non-finite reward (its samples are "
                            "dropped), loss or gradient (its optimizer steps are skipped)")
        g.add_argument("--adamw_kernel", type=str, default="auto", choices=["auto", "fused", "foreach", "loop"],
                       help="AdamW implementation: auto (fused where the device has the kernel: CPU, CUDA; else "
                            "foreach), fused, foreach (multi-tensor) or loop (per parameter); same checkpoint state")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "OptimSettings":
        at_least_one(args, "max_train_steps", "max_nonfinite_steps")
        return cls(
            seed=args.seed,
            sampler_seed=args.sampler_seed if args.sampler_seed is not None else args.seed,
            max_train_steps=args.max_train_steps, learning_rate=args.learning_rate,
            weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
            lr_scheduler=args.lr_scheduler, lr_warmup_steps=args.lr_warmup_steps,
            lr_num_cycles=args.lr_num_cycles, lr_power=args.lr_power, use_ema=args.use_ema,
            ema_decay=args.ema_decay, ema_start_step=args.ema_start_step,
            max_nonfinite_steps=args.max_nonfinite_steps, adamw_kernel=args.adamw_kernel,
            ema_warmup=args.ema_warmup, export_ema=args.export_ema, ema_update_interval=args.ema_update_interval,
        ).checked()

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        """EMA flags without --use_ema; schedule flags the chosen --lr_scheduler does not read
        (diffusers' get_scheduler: warm-up all but constant / piecewise_constant, cycles only
        cosine_with_restarts, power only polynomial)."""
        def given(*names):
            return [f"--{n}" for n in names if getattr(args, n) != getattr(defaults, n)]

        notes = []
        ema_flags = given("ema_decay", "ema_start_step", "ema_warmup", "export_ema", "ema_update_interval")
        if not args.use_ema and ema_flags:
            notes.append(f"{', '.join(ema_flags)}: no effect without --use_ema")
        sched = args.lr_scheduler
        unused = (given("lr_warmup_steps") if sched in ("constant", "piecewise_constant") else []) + \
            (given("lr_num_cycles") if sched != "cosine_with_restarts" else []) + \
            (given("lr_power") if sched != "polynomial" else [])
        if unused:
            notes.append(f"{', '.join(unused)}: no effect with --lr_scheduler {sched}")
        return notes

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        # sampler_seed as given: None when it is --seed's, so that a new --seed moves it too.
        same = section["sampler_seed"] == section["seed"]
        # configs written before --ema_warmup / --export_ema ran without them
        return {"ema_warmup": False, "export_ema": False, "ema_update_interval": 1, **section,
                "sampler_seed": None if same else section["sampler_seed"]}

    def check(self) -> None:
        check_number("learning_rate", self.learning_rate, at_least=0.0)  # 0: frozen weights (a control run)
        check_number("weight_decay", self.weight_decay, at_least=0.0)
        check_number("max_grad_norm", self.max_grad_norm, allow_inf=True)  # <= 0 or inf: measure only
        check_number("lr_power", self.lr_power)
        for flag, value in (("--seed", self.seed), ("--sampler_seed", self.sampler_seed)):
            if not -(2**63) <= value < 2**63:  # torch's generators take 64 bits; a larger seed fails deep inside
                raise ConfigError(f"{flag} {value} must fit in 64 bits (-2**63 <= seed < 2**63)")
        if self.lr_warmup_steps < 0:
            raise ConfigError(f"--lr_warmup_steps {self.lr_warmup_steps} must be >= 0")
        if self.use_ema and not 0.0 < self.ema_decay < 1.0:
            raise ConfigError(f"--ema_decay {self.ema_decay} must be in (0, 1)")
        if self.ema_update_interval < 1:
            raise ConfigError(f"--ema_update_interval {self.ema_update_interval} must be >= 1")
        from diffusers.optimization import SchedulerType

        valid = [t.value for t in SchedulerType]
        if self.lr_scheduler not in valid:
            raise ConfigError(f"--lr_scheduler {self.lr_scheduler!r} is unknown; choose from {', '.join(valid)}")
