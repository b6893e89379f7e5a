"""LoRA settings: whether adapters are trained, their rank, scale, dropout and target modules, and
the weights they start from. The adapters themselves are fastvideo/training/lora.py."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, flag_group

DEFAULT_TARGETS = ("to_k", "to_q", "to_v", "to_out.0")  # upstream DanceGRPO's LoRA targets
LORA_WEIGHTS_NAME = "pytorch_lora_weights.safetensors"  # diffusers' file name


def is_trainer_checkpoint(spec: str) -> bool:
    """"latest", or a checkpoint folder of this trainer (it has COMPLETE.json)."""
    return spec == "latest" or (Path(spec) / "COMPLETE.json").is_file()


def lora_weights_file(spec: str | Path) -> Path:
    """A LoRA file, or the folder holding pytorch_lora_weights.safetensors."""
    path = Path(spec)
    if path.is_dir():
        path = path / LORA_WEIGHTS_NAME
    if not path.is_file() or path.suffix != ".safetensors":
        raise ConfigError(f"--resume_from_lora_checkpoint {str(spec)!r}: neither a checkpoint of this trainer "
                          f"(checkpoint-N with COMPLETE.json) nor a folder with {LORA_WEIGHTS_NAME} / a "
                          ".safetensors LoRA file")
    return path


@dataclass(frozen=True)
class LoraSettings(Settings):
    enabled: bool
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    init_weights: str | None  # a diffusers-format LoRA file/folder to start the adapters from
    # The frozen base's precision: "master" = --master_weight_type (fp32 by default: upstream's LoRA
    # script loads it in float32 and computes under bf16 autocast), "bf16" = half its memory.
    base_precision: str = "master"

    @property
    def scale(self) -> float:
        """peft's multiplier on B @ A."""
        return self.alpha / self.rank

    def to_json(self) -> dict:
        d = asdict(self)
        d["target_modules"] = list(self.target_modules)
        return d

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        g = flag_group(parser, "LoRA")
        g.add_argument("--use_lora", action="store_true",
                       help="train LoRA adapters (peft) on a frozen base instead of all weights")
        g.add_argument("--lora_rank", type=int, default=128, help="adapter rank r")
        g.add_argument("--lora_alpha", type=float, default=256.0, help="adapter scale is lora_alpha / lora_rank")
        g.add_argument("--lora_dropout", type=float, default=0.0,
                       help="dropout on the adapter input (training only)")
        g.add_argument("--lora_target_modules", type=str, default=",".join(DEFAULT_TARGETS),
                       help="comma-separated module names (peft suffix match) that get adapters")
        g.add_argument("--lora_base_precision", choices=("master", "bf16"), default="master",
                       help="dtype of the frozen base under --use_lora: master = --master_weight_type (fp32 by "
                            "default, upstream's LoRA script; bf16 autocast computes in bf16 either way), bf16 = "
                            "half the base's memory (norms and embedders then see bf16 weights)")
        g.add_argument("--resume_from_lora_checkpoint", type=str, default=None,
                       help='upstream DanceGRPO\'s flag. A checkpoint of this trainer (or "latest") resumes it '
                            "exactly, like --resume_from_checkpoint; a diffusers LoRA file or folder "
                            f"({LORA_WEIGHTS_NAME}, e.g. upstream's lora-checkpoint-N) starts the adapters from "
                            "its weights at iteration 0")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LoraSettings":
        """A trainer checkpoint given as --resume_from_lora_checkpoint is a resume: fastvideo.compat
        passes it on as --resume_from_checkpoint; a LoRA file becomes init_weights."""
        targets = tuple(t.strip() for t in args.lora_target_modules.split(",") if t.strip())
        spec = args.resume_from_lora_checkpoint
        if not args.use_lora:
            if spec:
                raise ConfigError("--resume_from_lora_checkpoint needs --use_lora "
                                  "(or run fastvideo/train_grpo_flux_lora.py)")
            return cls(False, args.lora_rank, args.lora_alpha, args.lora_dropout, targets, None,
                       args.lora_base_precision)
        init = None
        if spec and not is_trainer_checkpoint(spec):
            init = spec
        return cls(True, args.lora_rank, args.lora_alpha, args.lora_dropout, targets, init,
                   args.lora_base_precision).checked()

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        changed = [f"--{n}" for n in ("lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules",
                                      "lora_base_precision")
                   if getattr(args, n) != getattr(defaults, n)]
        if changed and not args.use_lora:
            return [f"{', '.join(changed)} have no effect without --use_lora"]
        return []

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"use_lora": section["enabled"], "lora_rank": section["rank"], "lora_alpha": section["alpha"],
                "lora_dropout": section["dropout"], "lora_target_modules": ",".join(section["target_modules"]),
                "resume_from_lora_checkpoint": section["init_weights"],
                # a config.json from before the flag ran a bf16 base under --mixed_precision bf16
                "lora_base_precision": section.get("base_precision", "bf16")}

    def check(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"--lora_rank {self.rank} must be at least 1")
        if self.alpha <= 0:
            raise ConfigError(f"--lora_alpha {self.alpha} must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--lora_dropout {self.dropout} must be in [0, 1)")
        if not self.target_modules:
            raise ConfigError("--lora_target_modules is empty; e.g. to_k,to_q,to_v,to_out.0")
        if self.init_weights:
            lora_weights_file(self.init_weights)  # fails now, naming the problem, rather than after the models load
