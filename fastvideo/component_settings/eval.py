"""Evaluation settings: the --eval_* and --guard_* flags and their typed, validated settings
(EvalSettings; None when evaluation is off). The evaluation itself is fastvideo/eval/."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, flag_group

GUARD_ACTIONS = ("warn", "stop")
# Flags that only tune an evaluation / the guard (the ones that switch them on are checked instead).
EVAL_FLAGS = ("eval_steps", "eval_eta", "eval_num_images_per_prompt", "eval_batch_size", "eval_grid_prompts",
              "eval_max_sequence_length")
GUARD_FLAGS = ("guard_patience", "guard_drop", "guard_action")


@dataclass(frozen=True)
class GuardSettings:
    reward: str  # a registered reward name, scored on the eval images
    patience: int  # evaluations in a row that must look like hacking before the guard fires
    drop: float | None  # how far (guard reward's units) below its best counts as a fall; None: auto (noise)
    action: str  # warn | stop


@dataclass(frozen=True)
class EvalSettings(Settings):
    every: int  # evaluate every N iterations (and at iteration 0)
    prompts: str  # prompts .txt file, or a preprocessed videos2caption.json
    rewards: tuple[str, ...]  # every reward scored (trained ones and guard included)
    trained: tuple[tuple[str, float], ...]  # (name, weight) of the trained rewards
    steps: int  # sampling steps
    eta: float  # 0: ODE sampling
    num_images_per_prompt: int
    batch_size: int  # images per transformer call
    grid_prompts: int  # prompts (image 0 each) in a grid row
    max_sequence_length: int | None  # T5 length when encoding a .txt file (None: the training data's)
    guard: GuardSettings | None

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        add_eval_args(parser)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EvalSettings | None":
        """None when evaluation is off. The trained rewards are always scored, so this reads the
        reward flags too (fastvideo.rewards.settings.reward_spec)."""
        from fastvideo.rewards.settings import reward_spec

        return eval_settings_from_args(args, reward_spec(args))

    @classmethod
    def notes(cls, args: argparse.Namespace, defaults: argparse.Namespace) -> list[str]:
        """Evaluation flags given while evaluation (or the guard) is off."""
        changed = [n for n in EVAL_FLAGS + GUARD_FLAGS if getattr(args, n) != getattr(defaults, n)]
        if args.eval_every == 0 and changed:
            return [f"{', '.join('--' + n for n in changed)} have no effect without --eval_every N"]
        changed = [n for n in GUARD_FLAGS if getattr(args, n) != getattr(defaults, n)]
        if not args.guard_reward and changed:
            return [f"{', '.join('--' + n for n in changed)} have no effect without --guard_reward"]
        return []


    @classmethod
    def flags_from_resolved(cls, section: dict | None) -> dict:
        if section is None:
            return {"eval_every": 0}
        guard = section["guard"] or {}
        flags = {"eval_every": section["every"], "eval_prompts": section["prompts"],
                 "eval_rewards": ",".join(section["rewards"]), "eval_steps": section["steps"],
                 "eval_eta": section["eta"], "eval_num_images_per_prompt": section["num_images_per_prompt"],
                 "eval_batch_size": section["batch_size"], "eval_grid_prompts": section["grid_prompts"],
                 "eval_max_sequence_length": section["max_sequence_length"]}
        guard_flags = {f"guard_{k}": v for k, v in guard.items()}
        if "guard_drop" in guard_flags:  # None is auto; a number (older files: 0.0) stays that number
            drop = guard_flags["guard_drop"]
            guard_flags["guard_drop"] = "auto" if drop is None else repr(float(drop))
        return {**flags, **guard_flags}


def add_eval_args(parser: argparse.ArgumentParser) -> None:
    g = flag_group(parser, "evaluation")
    g.add_argument("--eval_every", type=int, default=0,
                   help="evaluate on held-out prompts at iteration 0 and every N iterations (0: never)")
    g.add_argument("--eval_prompts", type=str, default=None,
                   help="held-out prompts: a .txt file (one per line, e.g. assets/eval_prompts.txt) or a "
                        "preprocessed videos2caption.json; must not overlap the training prompts")
    g.add_argument("--eval_rewards", type=str, default=None,
                   help='rewards to score, e.g. "hpsv2,pickscore,detail" (the trained rewards and the guard '
                        "reward are always added)")
    g.add_argument("--eval_steps", type=int, default=None, help="sampling steps (default: --sampling_steps)")
    g.add_argument("--eval_eta", type=float, default=0.0, help="sampler noise; 0 is the deterministic ODE sampler")
    g.add_argument("--eval_num_images_per_prompt", type=int, default=1, help="images per prompt")
    g.add_argument("--eval_batch_size", type=int, default=None,
                   help="images per transformer call (default: --rollout_batch_size)")
    g.add_argument("--eval_grid_prompts", type=int, default=8, help="prompts shown in each row of eval_grid.png")
    g.add_argument("--eval_max_sequence_length", type=int, default=None,
                   help="T5 length used to encode a .txt prompt file (default: the training embeddings')")

    g = flag_group(parser, "reward-hacking guard")
    g.add_argument("--guard_reward", type=str, default=None,
                   help="a reward not trained on (e.g. detail, saturation, pickscore) watched on the eval images")
    g.add_argument("--guard_patience", type=int, default=2,
                   help="evaluations in a row with the trained reward up and the guard reward down before firing")
    g.add_argument("--guard_drop", type=str, default="auto",
                   help="how far below its best the guard reward must fall (in its own units) to count; auto "
                        "(default): 2 standard errors of the difference, measured on the eval images")
    g.add_argument("--guard_action", type=str, default="warn", choices=GUARD_ACTIONS,
                   help="warn, or stop the run cleanly after writing a checkpoint")


def _guard_drop(value) -> float | None:
    """--guard_drop: ``auto`` (None: measured noise) or a number >= 0."""
    if value is None or str(value).strip().lower() == "auto":
        return None
    try:
        drop = float(value)
    except ValueError:
        raise ConfigError(f"--guard_drop {value!r} must be 'auto' or a number >= 0 (the guard reward's units)") from None
    if not drop >= 0:
        raise ConfigError(f"--guard_drop {value} must be >= 0 (or 'auto': 2 standard errors, measured)")
    return drop


def _names(text: str | None) -> list[str]:
    if not text:
        return []
    names = [n.strip() for n in text.split(",")]
    if any(not n for n in names):
        raise ConfigError(f"--eval_rewards {text!r} has an empty entry (stray comma?)")
    return names


def eval_settings_from_args(args: argparse.Namespace, trained: list) -> EvalSettings | None:
    """Check the evaluation and guard flags; None when evaluation is off.

    trained: the training reward spec ([RewardSpec(name, weight)]). Raises ConfigError naming the
    flag and the fix."""
    from fastvideo.rewards.base import UnknownRewardError
    from fastvideo.rewards.registry import check_reward_name

    if args.eval_every < 0:
        raise ConfigError(f"--eval_every {args.eval_every} must be >= 0 (0 turns evaluation off)")
    if args.eval_every == 0:
        used = [f for f in ("eval_prompts", "eval_rewards", "guard_reward") if getattr(args, f)]
        if used:
            raise ConfigError(f"--{used[0]} needs --eval_every N (evaluation is off)")
        return None
    if not args.eval_prompts:
        raise ConfigError("--eval_every needs --eval_prompts FILE (for example assets/eval_prompts.txt)")
    for flag in ("eval_num_images_per_prompt", "eval_grid_prompts", "guard_patience"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag} must be at least 1")
    for flag in ("eval_steps", "eval_batch_size", "eval_max_sequence_length"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag} must be at least 1")
    if args.eval_eta < 0:
        raise ConfigError(f"--eval_eta {args.eval_eta} must be >= 0")
    drop = _guard_drop(args.guard_drop)
    trained_names = [s.name for s in trained]
    names = list(dict.fromkeys(trained_names + _names(args.eval_rewards)
                               + ([args.guard_reward] if args.guard_reward else [])))
    try:
        for n in names:
            check_reward_name(n)
    except UnknownRewardError as exc:
        raise ConfigError(f"--eval_rewards / --guard_reward: {exc}") from None
    guard = None
    if args.guard_reward:
        if args.guard_reward in trained_names:
            raise ConfigError(f"--guard_reward {args.guard_reward!r} is a trained reward; a guard must watch a "
                             "reward the run does not optimise (e.g. detail, saturation or another model)")
        guard = GuardSettings(args.guard_reward, args.guard_patience, drop, args.guard_action)
    return EvalSettings(
        every=args.eval_every, prompts=args.eval_prompts, rewards=tuple(names),
        trained=tuple((s.name, float(s.weight)) for s in trained),
        steps=args.eval_steps or args.sampling_steps, eta=args.eval_eta,
        num_images_per_prompt=args.eval_num_images_per_prompt,
        batch_size=args.eval_batch_size or args.rollout_batch_size, grid_prompts=args.eval_grid_prompts,
        max_sequence_length=args.eval_max_sequence_length, guard=guard,
    )
