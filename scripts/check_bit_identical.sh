#!/usr/bin/env bash
# Check that this working tree trains bit-identically to BASE_REF (a refactor changed no behaviour).
#
#   bash scripts/check_bit_identical.sh [BASE_REF]        (default BASE_REF: 919d5af)
#
# Checks BASE_REF out into a temporary detached git worktree, runs the CPU demo
# (scripts/demo/grpo_tiny_cpu.sh: tiny FLUX, 2 gloo processes, compressibility reward, held-out eval)
# there and in this tree with the same arguments, each tree with its own code (PYTHONPATH points at
# the tree being run, so the shared environment's editable install never wins, torchrun children
# included), then compares the two metrics.jsonl and eval.jsonl bit for bit with
# `python -m fastvideo.tools.compare_metrics` (of this tree). Exit 0 when identical, 1 at the first
# differing iteration/key, 2 when a run fails.
#
# Environment (all optional):
#   STEPS      training iterations of each run (default 12; the demo evaluates every 10)
#   PYTHON     the Python environment (default: this tree's .venv/bin/python). Nothing is installed:
#              the demo's env_setup.sh step gets a stand-in for pip (FLUX_GRPO_PIP).
#   WORK_DIR   where both runs go (default: a new temporary folder, removed afterwards unless KEEP=1)
#   KEEP=1     keep WORK_DIR and the base worktree (for a look at the logs and images)
#   EXTRA_ARGS extra training flags, passed to both runs
#   MODEL, ALGO, LINE  the demo's family, objective and library line (both runs write WORK_DIR/NAME/outputs,
#              whatever folder the demo would pick: MODEL=zimage ALGO=nft ... compares those runs)
set -euo pipefail
HEAD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_REF=${1:-919d5af}
STEPS=${STEPS:-12}
KEEP=${KEEP:-0}
PYTHON=${PYTHON:-$HEAD_ROOT/.venv/bin/python}
[ -x "$PYTHON" ] || { echo "check_bit_identical: no Python at $PYTHON: set PYTHON=/path/to/env/bin/python" >&2; exit 2; }
git -C "$HEAD_ROOT" rev-parse --verify --quiet "$BASE_REF^{commit}" >/dev/null \
  || { echo "check_bit_identical: '$BASE_REF' is not a commit of $HEAD_ROOT" >&2; exit 2; }

if [ -n "${WORK_DIR:-}" ]; then mkdir -p "$WORK_DIR"; else WORK_DIR=$(mktemp -d /tmp/bitcheck.XXXXXX); fi
WORK_DIR=$(cd "$WORK_DIR" && pwd)
BASE_TREE="$WORK_DIR/base_src"
cleanup() {
  if declare -F restore_stamp >/dev/null; then restore_stamp; fi
  if [ "$KEEP" = 1 ]; then echo "check_bit_identical: kept $WORK_DIR" >&2; return; fi
  git -C "$HEAD_ROOT" worktree remove --force "$BASE_TREE" 2>/dev/null || true
  rm -rf "$WORK_DIR"
}
trap cleanup EXIT
git -C "$HEAD_ROOT" worktree add --detach --force "$BASE_TREE" "$BASE_REF" >/dev/null 2>&1 \
  || { echo "check_bit_identical: could not check $BASE_REF out into $BASE_TREE" >&2; exit 2; }

# env_setup.sh (the demo's first step) must find the environment up to date and install nothing: it
# reads VIRTUAL_ENV and `python` on PATH, and FLUX_GRPO_PIP replaces pip should it think otherwise.
VENV_PREFIX=$("$PYTHON" -c 'import sys; print(sys.prefix)')
PIP_STANDIN="$WORK_DIR/no_pip.sh"
printf '#!/bin/sh\necho "check_bit_identical: not installing (pip $*)" >&2\n' > "$PIP_STANDIN"
chmod +x "$PIP_STANDIN"
# env_setup.sh rewrites the environment's stamp when a tree's pyproject.toml differs from the installed
# one; put the original back after each run, so a later real env_setup.sh still sees what was installed.
STAMP="$VENV_PREFIX/.flux_grpo_setup"
STAMP_SAVED="$WORK_DIR/stamp.saved"
if [ -f "$STAMP" ]; then cp "$STAMP" "$STAMP_SAVED"; fi
restore_stamp() { if [ -f "$STAMP_SAVED" ]; then cp "$STAMP_SAVED" "$STAMP" 2>/dev/null || true; fi; }

# run_demo NAME TREE: the demo in TREE with TREE's code; outputs in WORK_DIR/NAME, log in WORK_DIR/NAME.log
run_demo() {
  local name=$1 tree=$2
  echo "check_bit_identical: $name ($tree) - $STEPS iterations ..." >&2
  if ! env PYTHON="$PYTHON" PYTHONPATH="$tree" VIRTUAL_ENV="$VENV_PREFIX" PATH="$(dirname "$PYTHON"):$PATH" \
      FLUX_GRPO_PIP="$PIP_STANDIN" DEMO_DIR="$WORK_DIR/$name" OUTPUT_DIR="$WORK_DIR/$name/outputs" STEPS="$STEPS" \
      EXTRA_ARGS="${EXTRA_ARGS:-}" \
      bash "$tree/scripts/demo/grpo_tiny_cpu.sh" >"$WORK_DIR/$name.log" 2>&1; then
    restore_stamp
    echo "check_bit_identical: the $name run failed; last lines of $WORK_DIR/$name.log:" >&2
    tail -n 20 "$WORK_DIR/$name.log" >&2
    KEEP=1
    exit 2
  fi
  restore_stamp
}
run_demo base "$BASE_TREE"
run_demo head "$HEAD_ROOT"

echo "check_bit_identical: $BASE_REF ($(git -C "$HEAD_ROOT" rev-parse --short "$BASE_REF")) vs this tree" \
  "($(git -C "$HEAD_ROOT" rev-parse --short HEAD)$(git -C "$HEAD_ROOT" diff --quiet HEAD -- . 2>/dev/null || echo ' + uncommitted changes'))"
set +e
PYTHONPATH="$HEAD_ROOT" "$PYTHON" -m fastvideo.tools.compare_metrics "$WORK_DIR/base/outputs" "$WORK_DIR/head/outputs"
rc=$?
set -e
exit $rc
