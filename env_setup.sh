#!/usr/bin/env bash
# Set up a working flux-grpo environment on a fresh machine. Idempotent: a second run with the same
# target and the same pyproject.toml returns in about a second.
#
#   bash env_setup.sh [--target cpu|cuda|npu] [--venv DIR | --no-venv] [--with-parity] [--force]
#
#   --target       device stack to install for (default: detected; npu if npu-smi or CANN is present,
#                  cuda if nvidia-smi works, else cpu). torch-npu is installed ONLY for npu: on other
#                  machines it breaks `import torch`.
#   --venv DIR     virtual environment to create/use (default: .venv in this folder, unless a
#                  virtualenv or conda environment is already active, which is then used as is).
#   --no-venv      install into the current Python environment.
#   --with-parity  also install the hpsv2 package (no deps) for the HPS parity test, and the
#                  aesthetic / ImageReward references (scripts/install_reward_parity.sh).
#   --force        reinstall even if the stamp says the environment is up to date.
# Nothing is downloaded from a model hub: weights go to data/flux and hps_ckpt by hand (README).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

TARGET=""
VENV=""
USE_VENV=1
PARITY=0
FORCE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET="${2:-}"; shift 2 ;;
    --target=*) TARGET="${1#*=}"; shift ;;
    --venv) VENV="${2:-}"; shift 2 ;;
    --no-venv) USE_VENV=0; shift ;;
    --with-parity) PARITY=1; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "env_setup.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ -z "$TARGET" ]; then
  if command -v npu-smi >/dev/null 2>&1 || [ -d /usr/local/Ascend/driver ]; then TARGET=npu
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then TARGET=cuda
  else TARGET=cpu; fi
  echo "env_setup.sh: detected target '$TARGET' (override with --target cpu|cuda|npu)"
fi
case "$TARGET" in cpu|cuda|npu) ;; *) echo "env_setup.sh: --target must be cpu, cuda or npu, not '$TARGET'" >&2; exit 2 ;; esac

# Choose the Python environment.
if [ "$USE_VENV" = 1 ] && [ -z "$VENV" ] && [ -z "${VIRTUAL_ENV:-}" ] && [ -z "${CONDA_PREFIX:-}" ]; then
  VENV="$ROOT/.venv"
fi
if [ -n "$VENV" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    echo "env_setup.sh: creating virtual environment $VENV"
    "${PYTHON_BOOTSTRAP:-python3}" -m venv "$VENV"
  fi
  PY="$VENV/bin/python"
else
  PY="$(command -v python || command -v python3)"
fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "flux-grpo needs Python >= 3.10"'

STAMP_DIR="$("$PY" -c 'import sys; print(sys.prefix)')"
STAMP="$STAMP_DIR/.flux_grpo_setup"
WANT="$TARGET parity=$PARITY $(cat pyproject.toml scripts/install_hpsv2_parity.sh scripts/install_reward_parity.sh 2>/dev/null | cksum | cut -d' ' -f1)"
if [ "$FORCE" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import fastvideo, torch, diffusers" 2>/dev/null; then
  echo "env_setup.sh: environment up to date ($PY, target $TARGET)"
  exit 0
fi

PIP=("$PY" -m pip install --disable-pip-version-check)
case "$TARGET" in
  npu)
    # torch-npu X.Y.Z pairs with torch X.Y.Z; the recipe validates 2.7.1 with CANN 8.3.RC1+.
    "${PIP[@]}" "torch==2.7.1" "torchvision==0.22.1" "torch-npu==2.7.1"
    ;;
  cpu|cuda)
    # Keep an already-installed torch when it is in range; never install torch-npu here.
    if ! "$PY" -c 'import torch, torchvision' 2>/dev/null; then
      "${PIP[@]}" "torch>=2.7.1,<2.15" "torchvision>=0.22.1"
    fi
    if "$PY" -c 'import torch_npu' 2>/dev/null; then
      echo "env_setup.sh: warning: torch_npu is installed in this $TARGET environment; it breaks 'import torch' without CANN. Remove it: $PY -m pip uninstall torch-npu" >&2
    fi
    ;;
esac
"${PIP[@]}" -e ".[test]"
if [ "$PARITY" = 1 ]; then
  PYTHON="$PY" bash "$ROOT/scripts/install_hpsv2_parity.sh"
fi
"$PY" -c "import fastvideo, torch, diffusers, transformers, open_clip; print('env_setup.sh: ok - torch', torch.__version__, '| diffusers', diffusers.__version__, '| transformers', transformers.__version__)"
echo "$WANT" > "$STAMP"
if [ "$TARGET" = npu ]; then
  cat <<'MSG'
env_setup.sh: NPU environment installed. Before running, bring in CANN (8.3.RC1 or later):
    source /usr/local/Ascend/cann/set_env.sh        # or your CANN path; see scripts/npu_env.sh
The launchers in scripts/ do this for you (override the path with CANN_SET_ENV).
MSG
fi
