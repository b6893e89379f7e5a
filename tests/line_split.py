"""Which test files the current library line's suite leaves to the recipe line's.

CI runs the suite on both library lines (.ci/run). A file listed here tests the trainer's own
mechanics on the tiny FLUX.1 (checkpoints, resume, signals, run folders, bad input, the pre-flight,
rewards' plumbing, evaluation, the lean iteration's bookkeeping, GRPO's maths): what it asserts does
not change with diffusers / transformers / peft, so running it a second time on the current line
costs minutes and checks nothing new. The recipe line's suite (README's default test command) runs
every file; on the current line these are skipped with the reason below. What the lines differ in
stays on both: model families and their parity with the stock pipelines, loading, the patches,
samplers against diffusers' schedulers, reward models against their packages, LoRA (peft),
compile, sequence parallelism's attention, FSDP wrapping of each line's blocks, preprocessing (the
text encoders), the launchers' line choice, and every current-line family's training.

FLUX_GRPO_ALL_TESTS=1 runs them on the current line too.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REASON = ("line-independent (tests/line_split.py): the trainer's own mechanics, run by the recipe line's suite; "
          "FLUX_GRPO_ALL_TESTS=1 runs it here too")

LINE_INDEPENDENT = (
)


def skipped_here(relpath: str, line: str, environ: dict) -> bool:
    """Whether the test file ``relpath`` (relative to tests/) is left to the other line's suite."""
    if line != "current" or environ.get("FLUX_GRPO_ALL_TESTS", "0") == "1":
        return False
    return relpath in LINE_INDEPENDENT


def missing() -> list[str]:
    """Listed files that do not exist (a rename would silently run them on one line... or none)."""
    return [p for p in LINE_INDEPENDENT if not (TESTS / p).is_file()]
