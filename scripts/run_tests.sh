#!/usr/bin/env bash
# The test command: sets up the environment (quick when already done) and runs the suite on CPU.
#   bash scripts/run_tests.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash env_setup.sh --target cpu --with-parity
export FASTVIDEO_DEVICE=cpu
source scripts/common.sh
# FLUX_GRPO_HCCL_RULES=1: every 2-rank test checks its collectives against HCCL's rules (tests/hccl_rules.py).
export FASTVIDEO_DEVICE=cpu FLUX_GRPO_REQUIRE_PARITY=${FLUX_GRPO_REQUIRE_PARITY:-1} FLUX_GRPO_HCCL_RULES=${FLUX_GRPO_HCCL_RULES:-1}
set +e
"$PYTHON" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "run_tests.sh: pytest collected no tests - treating as a failure" >&2
  exit 1
fi
exit "$rc"
