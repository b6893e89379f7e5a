"""DanceGRPO's (and the Ascend recipe's) flag names: legacy reward switches, the misspelt FSDP
flag, --ignore_last, --resume_from_lora_checkpoint naming a checkpoint, and flags kept only so that
its launch lines parse."""

from __future__ import annotations

import argparse

from fastvideo.errors import ConfigError
from fastvideo.settings import flag_group

# Flags accepted only so that upstream launch lines keep working; they change nothing here.
COMPAT_ONLY_FLAGS = {
    "cache_dir": "no model hub is used: every model is loaded from a local folder",
    "train_sp_batch_size": "a sequence group's ranks hold the same samples (--sp_size); --train_batch_size counts "
                           "the prompts of each data-parallel rank",
    "logging_dir": "metrics go to OUTPUT_DIR/metrics.jsonl; wandb writes under OUTPUT_DIR/wandb",
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    flag_group(parser, "models").add_argument("--cache_dir", type=str, default=None, help="compatibility only")
    g = flag_group(parser, "rewards")
    g.add_argument("--use_hpsv2", action="store_true", help="alias of --rewards hpsv2:1.0")
    g.add_argument("--use_pickscore", action="store_true", help="alias of --rewards pickscore:1.0")
    g.add_argument("--use_hpsv3", action="store_true",
                   help="upstream's LoRA script: HPSv3 is not built in; refused with how to serve it through the "
                        "reward server's --plugin")
    flag_group(parser, "GRPO").add_argument(
        "--ignore_last", action="store_true",
        help="do not train the last transition: the default; accepted for upstream launch lines")
    g = flag_group(parser, "parallelism")
    g.add_argument("--fsdp_sharding_startegy", dest="fsdp_sharding_strategy", type=str,
                   default=argparse.SUPPRESS, choices=["full", "hybrid", "hybrid_full", "hybrid_zero2", "none"],
                   help="DanceGRPO's spelling of --fsdp_sharding_strategy")
    g.add_argument("--train_sp_batch_size", type=int, default=1, help="compatibility only")
    flag_group(parser, "outputs").add_argument("--logging_dir", type=str, default="logs",
                                               help="compatibility only")


HPSV3_REFUSAL = (
    "--use_hpsv3: HPSv3 (the hpsv3 package's HPSv3RewardInferencer, which upstream's LoRA script calls) is not "
    "built into this trainer. Serve it with the reward server's plug-in, in an environment that has hpsv3: "
    "python -m fastvideo.tools.reward_server --plugin hpsv3=MODULE:FACTORY (FACTORY(device=, batch_size=) returns "
    "a callable (images, prompts) -> scores; fastvideo/tools/reward_server.py), then train with "
    "--rewards remote:http://HOST:PORT/hpsv3:1.0 instead of --use_hpsv3")


def _legacy_rewards(args: argparse.Namespace) -> str | None:
    """--use_hpsv2 / --use_pickscore as a --rewards spec (weight 1.0 each); None if neither."""
    names = [n for n, on in (("hpsv2", args.use_hpsv2), ("pickscore", args.use_pickscore)) if on]
    if not names:
        return None
    if args.rewards:
        raise ConfigError("give the rewards either with --rewards or with --use_hpsv2/--use_pickscore, not both")
    return ",".join(f"{n}:1.0" for n in names)


def _lora_resume(args: argparse.Namespace) -> dict:
    """--resume_from_lora_checkpoint naming a checkpoint of this trainer is a resume."""
    from fastvideo.component_settings.lora import is_trainer_checkpoint

    spec = args.resume_from_lora_checkpoint
    if not (args.use_lora and spec and is_trainer_checkpoint(spec)):
        return {}
    if args.resume_from_checkpoint and args.resume_from_checkpoint != spec:
        raise ConfigError("--resume_from_checkpoint and --resume_from_lora_checkpoint name different "
                          "checkpoints; give one")
    return {"resume_from_checkpoint": spec}


def translate(args: argparse.Namespace, defaults: argparse.Namespace) -> tuple[dict, list[str]]:
    """(flag values to use instead, notes)."""
    if args.train_last_step and args.ignore_last:
        raise ConfigError("--train_last_step and --ignore_last contradict each other; give one (not training "
                          "the last transition is the default)")
    if args.use_hpsv3:
        raise ConfigError(HPSV3_REFUSAL)
    changes = _lora_resume(args)
    legacy = _legacy_rewards(args)
    if legacy:
        changes["rewards"] = legacy
    notes = [f"--{name} is accepted for compatibility and has no effect: {why}"
             for name, why in COMPAT_ONLY_FLAGS.items() if getattr(args, name) != getattr(defaults, name)]
    if args.ignore_last:
        notes.append("--ignore_last is accepted for compatibility and has no effect: the last transition is never "
                     "trained unless --train_last_step is given")
    return changes, notes
