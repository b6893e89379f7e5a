#!/usr/bin/env python3
"""Mutation check: do the tests notice plausible bugs?

    python tools/mutate.py [CHECKOUT=.] [MUTATIONS=tests/mutations.tsv] [--python PY] [--full]
                           [--rows 3,7-9] [--resolve-only]

MUTATIONS has one mutation a line (lines starting with # are comments), tab-separated:
    FILE  LINE  ORIGINAL_LINE  MUTATED_LINE  TESTS
FILE is relative to CHECKOUT; ORIGINAL_LINE is the exact text of that line (when the line has
moved, the one line holding that text is used); TESTS are pytest node ids or paths, space
separated: the tests expected to catch the mutation (--full runs the whole suite instead).

Each mutation is applied alone, its tests run with CHECKOUT first on PYTHONPATH (so the checkout's
code wins over any installed copy), and the file is put back from git. A mutation "survives" when
its tests still pass: a test is missing or too weak, or the mutation does not change behaviour
(then replace it with one that does). --resolve-only runs nothing: it checks that every row's
original line is found (tests/test_mutations_table.py keeps the table pointing at the code).

Exit status: 0 when every mutation was killed (or, with --resolve-only, every row resolves),
1 otherwise, 2 for a malformed table or a checkout with uncommitted changes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass
class Row:
    number: int  # 1-based among the table's mutations
    path: str
    line: int
    original: str
    mutated: str
    tests: list[str]


class TableError(ValueError):
    pass


def read_table(path: str) -> list[Row]:
    rows = []
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 5:
            raise TableError(f"{path}:{n}: expected 5 tab-separated fields, got {len(parts)}")
        rel, ln, original, mutated, tests = parts
        rows.append(Row(len(rows) + 1, rel, int(ln), original, mutated, tests.split()))
    return rows


def locate(text: list[str], row: Row) -> int | None:
    """0-based index of the row's original line: at row.line, else the only line with its text."""
    k = row.line - 1
    if 0 <= k < len(text) and text[k] == row.original:
        return k
    hits = [j for j, t in enumerate(text) if t == row.original]
    return hits[0] if len(hits) == 1 else None


def unresolved(root: str, rows: list[Row]) -> list[str]:
    """A line per row whose file or original line is not found, or whose mutation changes nothing."""
    out = []
    for row in rows:
        path = os.path.join(root, row.path)
        if not os.path.isfile(path):
            out.append(f"{row.number}: {row.path}: no such file")
        elif locate(open(path, encoding="utf-8").read().split("\n"), row) is None:
            out.append(f"{row.number}: {row.path}:{row.line}: original line not found exactly once: {row.original.strip()}")
        elif row.mutated == row.original:
            out.append(f"{row.number}: {row.path}:{row.line}: the mutation is the original line")
    return out


def run_one(root: str, row: Row, py: str, full: bool, env: dict) -> tuple[bool | None, str]:
    """Apply the row, run its tests, restore the file: (killed, last line of pytest's output);
    killed is None when the original line is not found."""
    path = os.path.join(root, row.path)
    text = open(path, encoding="utf-8").read().split("\n")
    k = locate(text, row)
    if k is None:
        return None, "original line not found exactly once"
    text[k] = row.mutated
    open(path, "w", encoding="utf-8").write("\n".join(text))
    try:
        targets = ["tests"] if full else row.tests
        r = subprocess.run([py, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *targets], cwd=root,
                           env=env, capture_output=True, text=True)
    finally:
        subprocess.run(["git", "checkout", "--", row.path], cwd=root, check=True)
    return r.returncode != 0, (r.stdout.strip().splitlines() or [""])[-1][:80]


def parse_rows(spec: str | None, count: int) -> set[int]:
    if not spec:
        return set(range(1, count + 1))
    chosen = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        chosen.update(range(int(lo), int(hi or lo) + 1))
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", nargs="?", default=".")
    ap.add_argument("mutations", nargs="?", default=None, help="default: CHECKOUT/tests/mutations.tsv")
    ap.add_argument("--python", default=None, help="interpreter with the dependencies (default: this one)")
    ap.add_argument("--full", action="store_true", help="run the whole suite for every mutation")
    ap.add_argument("--rows", default=None, help="only these rows (1-based, e.g. 3,7-9)")
    ap.add_argument("--resolve-only", action="store_true", help="only check that every row's original is found")
    a = ap.parse_args(argv)
    root = os.path.abspath(a.checkout)
    try:
        rows = read_table(a.mutations or os.path.join(root, "tests", "mutations.tsv"))
    except TableError as exc:
        print(f"mutate.py: {exc}", file=sys.stderr)
        return 2
    if a.resolve_only:
        problems = unresolved(root, rows)
        print("\n".join(problems + [f"{len(problems)} of {len(rows)} rows do not resolve"]))
        return 1 if problems else 0
    if subprocess.run(["git", "diff", "--quiet"], cwd=root).returncode != 0:
        print("mutate.py: the checkout has uncommitted changes; commit or stash them first", file=sys.stderr)
        return 2
    # FLUX_GRPO_ALL_TESTS: a row's tests run whichever line's table it is in (tests/line_split.py)
    env = dict(os.environ, FASTVIDEO_DEVICE="cpu", HF_HUB_OFFLINE="1", FLUX_GRPO_ALL_TESTS="1",
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    chosen = parse_rows(a.rows, len(rows))
    survivors, skipped = [], 0
    for row in (r for r in rows if r.number in chosen):
        start = time.time()
        killed, tail = run_one(root, row, a.python or sys.executable, a.full, env)
        if killed is None:
            skipped += 1
            print(f"{row.number:3d} SKIPPED  {row.path}:{row.line}: {tail}", flush=True)
            continue
        print(f"{row.number:3d} {'killed  ' if killed else 'SURVIVED'} {row.path}:{row.line} "
              f"[{time.time() - start:.0f} s] {tail}", flush=True)
        if not killed:
            survivors.append(f"{row.path}:{row.line}: {row.mutated.strip()}")
    print(f"{len(survivors)} of {len(chosen)} mutations survived, {skipped} skipped")
    for s in survivors:
        print("  survived:", s)
    return 1 if survivors or skipped else 0


if __name__ == "__main__":
    sys.exit(main())
