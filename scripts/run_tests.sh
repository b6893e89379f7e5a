#!/usr/bin/env bash
# The test command: sets up the environment (quick when already done) and runs the suite on CPU.
#   bash scripts/run_tests.sh [pytest args...]              the recipe library line (.venv)
#   LINE=current bash scripts/run_tests.sh [pytest args...] the current library line (.venv-current)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export LINE=${LINE:-recipe}
bash env_setup.sh --target cpu --with-parity --line "$LINE"
export FASTVIDEO_DEVICE=cpu
source scripts/common.sh
# FLUX_GRPO_HCCL_RULES=1: every 2-rank test checks its collectives against HCCL's rules (tests/hccl_rules.py).
export FASTVIDEO_DEVICE=cpu FLUX_GRPO_REQUIRE_PARITY=${FLUX_GRPO_REQUIRE_PARITY:-1} FLUX_GRPO_HCCL_RULES=${FLUX_GRPO_HCCL_RULES:-1}
# Test files are spread over FLUX_GRPO_TEST_WORKERS processes (default 2, one per core here; 0 runs
# them in this process): much of a test's time is single-threaded (imports, start-ups, Python), so
# two processes keep both cores busy. A file's tests stay on one worker (--dist loadfile): they share
# its module fixtures (the 2-rank runs several tests assert on).
WORKERS=${FLUX_GRPO_TEST_WORKERS:-2}
XDIST=()
if [ "$WORKERS" != 0 ] && "$PYTHON" -c "import xdist" 2>/dev/null; then
  XDIST=(-n "$WORKERS" --dist loadfile)
fi
set +e
"$PYTHON" -m pytest -q --durations=25 "${XDIST[@]}" "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "run_tests.sh: pytest collected no tests - treating as a failure" >&2
  exit 1
fi
exit "$rc"
