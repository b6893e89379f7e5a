"""Check that two training runs logged bit-identical numbers (a refactor changed no behaviour).

    python -m fastvideo.tools.compare_metrics RUN_A RUN_B

RUN_A / RUN_B: two --output_dir folders (or two metrics.jsonl files). Every iteration of
metrics.jsonl must carry the same values, compared as exact JSON floats (the repr of the parsed
float: no tolerance, -0.0 differs from 0.0, NaN equals NaN); the keys that must be present in both
are the rewards (reward_mean, reward_std, reward/*), loss, grad_norm, adv_*, ratio_mean,
clip_fraction, first_ratio_dev and kl* (when either run logs it); every other key the two share is
compared too. Wall-clock and memory figures (time_*, samples_per_s, peak_memory*) are ignored.
When both folders hold eval.jsonl, its rows are compared the same way (nested keys flattened).

Exit status: 0 when equal, 1 at the first difference (named: file, iteration, key, both values),
2 on a usage error (a missing or empty metrics file). scripts/check_bit_identical.sh uses this.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastvideo import utils
from fastvideo.errors import one_line_errors
from fastvideo.utils import flatten_dict

EXIT_EQUAL, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2

# Keys whose value depends on the machine's speed or allocator, not on the maths.
IGNORED = re.compile(r"^(time_.*|.*/time_.*|samples_per_s|peak_memory.*)$")
# Keys that must be logged by both runs (a key lost in a refactor is a difference too).
REQUIRED = re.compile(r"^(reward_mean|reward_std|reward/.*|loss|grad_norm|adv_.*|ratio_mean|clip_fraction"
                      r"|first_ratio_dev|kl.*)$")
# Shown in the summary table, when present.
TABLE_KEYS = ("reward_mean", "loss", "grad_norm", "ratio_mean")


@dataclass(frozen=True)
class Difference:
    """The first place two runs disagree."""

    file: str
    row: int  # 1-based line in the file
    iteration: Any  # the row's "iteration" value (None when absent)
    key: str
    value_a: Any
    value_b: Any

    def describe(self) -> str:
        return (f"{self.file}: iteration {self.iteration} (line {self.row}), key '{self.key}': "
                f"{_show(self.value_a)} vs {_show(self.value_b)}")


class MetricsFileError(ValueError):
    """A run folder without a readable metrics file."""


_MISSING = object()


def _show(v: Any) -> str:
    return "<missing>" if v is _MISSING else repr(v)


def exact(v: Any) -> str:
    """A canonical text of a JSON value that two values share only when they are bit-identical.

    repr(float) round-trips exactly, so equal reprs mean equal bits (and 1 vs 1.0 differ by type).
    """
    return repr(v)


def flatten(row: dict) -> dict[str, Any]:
    """{"rewards": {"detail": {"mean": 1}}} -> {"rewards/detail/mean": 1}; lists stay values."""
    return flatten_dict(row, "/")


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (blank lines skipped; a torn last line dropped, saying so)."""
    return utils.read_jsonl(path)


def compare_rows(rows_a: list[dict], rows_b: list[dict], file: str,
                 required: re.Pattern | None = REQUIRED) -> Difference | None:
    """The first difference between two lists of logged rows, or None when bit-identical.

    A row count mismatch is reported on the first row one file lacks (key '<row>').
    """
    for i, (ra, rb) in enumerate(zip(rows_a, rows_b), start=1):
        fa, fb = flatten(ra), flatten(rb)
        it = ra.get("iteration", rb.get("iteration"))
        keys = sorted(k for k in set(fa) | set(fb) if not IGNORED.match(k))
        for k in keys:
            va, vb = fa.get(k, _MISSING), fb.get(k, _MISSING)
            if va is _MISSING or vb is _MISSING:
                # A key only one run logs is a difference when it is one of the compared quantities.
                if required is not None and required.match(k):
                    return Difference(file, i, it, k, va, vb)
                continue
            if exact(va) != exact(vb):
                return Difference(file, i, it, k, va, vb)
    if len(rows_a) != len(rows_b):
        n = min(len(rows_a), len(rows_b)) + 1
        longer = rows_a if len(rows_a) > len(rows_b) else rows_b
        it = longer[n - 1].get("iteration")
        return Difference(file, n, it, "<row>",
                          f"{len(rows_a)} rows" if len(rows_a) >= n else _MISSING,
                          f"{len(rows_b)} rows" if len(rows_b) >= n else _MISSING)
    return None


def _metrics_path(run: Path) -> Path:
    path = run / "metrics.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise MetricsFileError(f"{path} does not exist: pass a training --output_dir or a metrics.jsonl file")
    return path


def compare_run_folders(run_a: Path, run_b: Path) -> tuple[Difference | None, list[dict], list[dict], bool]:
    """(first difference or None, rows of A, rows of B, whether eval.jsonl was compared)."""
    pa, pb = _metrics_path(run_a), _metrics_path(run_b)
    rows_a, rows_b = read_jsonl(pa), read_jsonl(pb)
    if not rows_a or not rows_b:
        raise MetricsFileError(f"{pa if not rows_a else pb} is empty: the run logged no iteration")
    diff = compare_rows(rows_a, rows_b, "metrics.jsonl")
    ea, eb = pa.parent / "eval.jsonl", pb.parent / "eval.jsonl"
    has_eval = ea.is_file() or eb.is_file()
    if diff is None and has_eval:
        if not (ea.is_file() and eb.is_file()):
            return Difference("eval.jsonl", 1, None, "<file>", "present" if ea.is_file() else _MISSING,
                              "present" if eb.is_file() else _MISSING), rows_a, rows_b, True
        diff = compare_rows(read_jsonl(ea), read_jsonl(eb), "eval.jsonl", required=None)
    return diff, rows_a, rows_b, has_eval


def format_table(rows_a: list[dict], rows_b: list[dict]) -> str:
    """One line per iteration: the main figures of run A and '=' where run B logged the same bits."""
    keys = [k for k in TABLE_KEYS if any(k in r for r in rows_a)]
    head = f"{'iter':>5} " + " ".join(f"{k:>24}" for k in keys)
    lines = [head]
    for ra, rb in zip(rows_a, rows_b):
        cells = []
        for k in keys:
            va, vb = ra.get(k, _MISSING), rb.get(k, _MISSING)
            mark = "=" if exact(va) == exact(vb) else "!"
            cells.append(f"{_show(va):>22} {mark}")
        lines.append(f"{ra.get('iteration', '?'):>5} " + " ".join(cells))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m fastvideo.tools.compare_metrics",
                                description="Check two runs' metrics.jsonl (and eval.jsonl) are bit-identical.")
    p.add_argument("run_a", type=Path, help="reference run: its --output_dir or its metrics.jsonl")
    p.add_argument("run_b", type=Path, help="run to check against A")
    p.add_argument("--quiet", action="store_true", help="no table, only the verdict")
    return one_line_errors(p)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        diff, rows_a, rows_b, has_eval = compare_run_folders(args.run_a, args.run_b)
    except (MetricsFileError, utils.LogFileError) as exc:
        print(f"compare_metrics: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not args.quiet:
        print(format_table(rows_a, rows_b))
    if diff is not None:
        print(f"DIFFERENT: {diff.describe()}")
        return EXIT_DIFFERENT
    n_keys = len([k for k in flatten(rows_a[0]) if not IGNORED.match(k)])
    print(f"IDENTICAL: {len(rows_a)} iterations x {n_keys} keys of metrics.jsonl"
          + (" and eval.jsonl" if has_eval else "") + " bit for bit (time_*, samples_per_s, peak_memory ignored)")
    return EXIT_EQUAL


if __name__ == "__main__":
    sys.exit(main())
