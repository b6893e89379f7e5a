"""Reward-hacking guard and the best checkpoint, decided from the held-out evaluations.

After each evaluation: the trained score is the weighted sum of the trained rewards' means on
the eval images; the guard score is a reward the run does not optimise (a preference model, or an
image statistic such as ``detail``). An evaluation *looks like hacking* when the trained score is
above the base model's (the first evaluation) while the guard score is more than ``drop`` below
its best so far. ``patience`` such evaluations in a row fire the guard (warn, or stop the run).

``drop`` None (``--guard_drop auto``, the default) measures the evaluation's own noise instead of
taking a fixed number: a fall counts when it exceeds AUTO_Z standard errors of the difference of the
two means, ``AUTO_Z * sqrt(se_best**2 + se_now**2)`` with ``se = std / sqrt(images)`` of the guard
reward over each evaluation's images. A fixed 0 flagged noise (0.1425 against 0.1426).

The best checkpoint (the guard-adjusted choice) is the trained evaluation (iteration >= 1) with
the highest trained score among those the guard did not flag as hacking (without a guard, simply
the highest trained score; ties keep the earlier one), and never one scoring below the first
evaluation (the base model's, iteration 0): a run that only got worse has no best. It is published
as OUTPUT_DIR/best: hard links to (or copies of) the checkpoint's files, so deleting the checkpoint
during rotation leaves it intact.

The state is a fold over the evaluation records, so a resumed run rebuilds it from eval.jsonl.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fastvideo.utils import atomic_write_json, main_print

AUTO_Z = 2.0  # about 95% two-sided for a difference of two independent means
BEST_DIR = "best"
BEST_MARKER = "BEST.json"


@dataclass
class GuardDecision:
    hacking: bool  # this evaluation looks like hacking
    streak: int  # hacking evaluations in a row, this one included
    fired: bool  # streak reached patience (at this evaluation)
    new_best: bool  # this evaluation is the new best checkpoint
    guard_best: float | None

    def as_dict(self) -> dict:
        return {"hacking": self.hacking, "streak": self.streak, "fired": self.fired,
                "guard_best": self.guard_best}


def standard_error(scores) -> float:
    """std / sqrt(n) of a tensor of per-image scores (finite ones); 0 for fewer than two."""
    flat = scores.reshape(-1).double()
    flat = flat[flat.isfinite()]
    if flat.numel() < 2:
        return 0.0
    return float(flat.std() / math.sqrt(flat.numel()))


class RewardHackingGuard:
    """Feed it one evaluation at a time with :meth:`update`.

    patience / drop: see the module docstring; guard_enabled False tracks the best checkpoint only."""

    def __init__(self, patience: int = 2, drop: float | None = None, guard_enabled: bool = True):
        if patience < 1 or (drop is not None and drop < 0):
            raise ValueError(f"patience must be >= 1 and drop >= 0 (or None: auto), got {patience}, {drop}")
        self.patience, self.drop, self.enabled = patience, drop, guard_enabled
        self.base_trained: float | None = None
        self.guard_best: float | None = None
        self.guard_best_se = 0.0
        self.threshold = 0.0  # the fall that counted at the last evaluation
        self.streak = 0
        self.best_iteration: int | None = None
        self.best_score = -math.inf

    def fall_threshold(self, guard_se: float) -> float:
        """How far below its best the guard score must be to count as a fall."""
        if self.drop is not None:
            return self.drop
        return AUTO_Z * math.sqrt(self.guard_best_se ** 2 + guard_se ** 2)

    def update(self, iteration: int, trained: float, guard: float | None = None,
               guard_se: float = 0.0) -> GuardDecision:
        """``guard_se``: the standard error of ``guard`` (std / sqrt(images)) at this evaluation."""
        if self.enabled and guard is None:
            raise ValueError("the guard is on but no guard score was given")
        if self.base_trained is None:
            self.base_trained = trained
        hacking = False
        if self.enabled:
            if self.guard_best is None or guard > self.guard_best:
                self.guard_best, self.guard_best_se = guard, guard_se
            self.threshold = self.fall_threshold(guard_se)
            fell = guard < self.guard_best - self.threshold
            hacking = fell and trained > self.base_trained
        self.streak = self.streak + 1 if hacking else 0
        fired = hacking and self.streak >= self.patience
        # never worse than the base model's evaluation (iteration 0): best/ must be worth taking
        new_best = iteration >= 1 and not hacking and trained > self.best_score and trained >= self.base_trained
        if new_best:
            self.best_iteration, self.best_score = iteration, trained
        return GuardDecision(hacking, self.streak, fired, new_best, self.guard_best)

    def message(self, iteration: int, trained: float, guard_name: str, guard: float,
                output_dir: str | os.PathLike = "OUTPUT_DIR") -> str:
        return (f"[guard] reward hacking suspected at iteration {iteration}: the trained reward on the held-out "
                f"prompts rose to {trained:.4g} (base {self.base_trained:.4g}) while {guard_name} fell to "
                f"{guard:.4g}, more than {self.threshold:.3g} below its best {self.guard_best:.4g}, for {self.streak} "
                f"evaluations in a row. " + (f"Best checkpoint so far: iteration {self.best_iteration} "
                                             f"({Path(output_dir) / BEST_DIR})."
                                            if self.best_iteration is not None else "No best checkpoint yet."))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def publish_best(checkpoint: str | os.PathLike, output_dir: str | os.PathLike, iteration: int,
                 score: float) -> Path:
    """Make OUTPUT_DIR/best a hard-linked copy of ``checkpoint`` plus BEST.json (fsynced); rank 0 only.

    Swapped in by renames (best -> best.old-*, best.tmp-* -> best), so a crash leaves the old best
    or the new one, or -- between the two renames -- the old one under best.old-*, which
    :func:`recover_best` puts back on the next start."""
    src, out = Path(checkpoint), Path(output_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f"{BEST_DIR}.tmp-", dir=out))
    for f in sorted(src.rglob("*")):
        target = tmp / f.relative_to(src)
        if f.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(f, target)
    marker = {"iteration": int(iteration), "score": float(score), "source": src.name}
    atomic_write_json(tmp / BEST_MARKER, marker)  # fsynced before the swap
    final = out / BEST_DIR
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{BEST_DIR}.old-", dir=out))
        os.rmdir(old)
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def recover_best(output_dir: str | os.PathLike) -> None:
    """Finish or undo a :func:`publish_best` a crash interrupted; rank 0, before the run starts.

    best.tmp-* is a new best not swapped in (its evaluation was not recorded either: the resumed
    run evaluates again and publishes it again), so it is removed; best.old-* is the previous best,
    put back when best/ is missing and removed otherwise."""
    out = Path(output_dir)
    for tmp in sorted(out.glob(f"{BEST_DIR}.tmp-*")):
        shutil.rmtree(tmp, ignore_errors=True)
        main_print(f"[eval] removed {tmp}: an interrupted publication of the best checkpoint")
    olds = sorted(out.glob(f"{BEST_DIR}.old-*"))
    if olds and not (out / BEST_DIR).exists():
        os.replace(olds.pop(), out / BEST_DIR)
        main_print(f"[eval] restored {out / BEST_DIR} from the interrupted publication's previous best")
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)
