#!/usr/bin/env bash
# Sourced by every launcher: picks the Python, detects the device, loads NPU settings on Ascend.
# Overridable: PYTHON, FASTVIDEO_DEVICE (npu|cuda|cpu), NPU_ENV_FILE.
_FG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$_FG_ROOT/.venv/bin/python" ]; then PYTHON="$_FG_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHON
if [ -z "${FASTVIDEO_DEVICE:-}" ]; then
  FASTVIDEO_DEVICE=$("$PYTHON" -c "from fastvideo.platform import device_type; print(device_type())" 2>/dev/null || echo cpu)
fi
export FASTVIDEO_DEVICE
if [ "$FASTVIDEO_DEVICE" = "npu" ]; then
  # shellcheck disable=SC1090
  source "${NPU_ENV_FILE:-$_FG_ROOT/scripts/npu_env.sh}"
fi
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
# torchrun (from the same environment as PYTHON)
TORCHRUN=("$PYTHON" -m torch.distributed.run)

# fg_run ARGS...: run torchrun with ARGS, or with DRY_RUN=1 print the command (one line) and exit 0.
fg_run() {
  if [ "${DRY_RUN:-0}" = 1 ]; then
    printf '%q ' "${TORCHRUN[@]}" "$@"
    printf '\n'
    return 0
  fi
  echo "+ torchrun $*" >&2
  "${TORCHRUN[@]}" "$@"
}
