#!/usr/bin/env bash
# Set up a working flux-grpo environment on a fresh machine. Idempotent: a second run with the same
# target and the same pyproject.toml returns in about a second.
#
#   bash env_setup.sh [--line recipe|current] [--target cpu|cuda|npu] [--venv DIR | --no-venv] [--with-parity]
#                     [--force] [--cann-version V] [--cann-home DIR] [--wheelhouse DIR]
#   bash env_setup.sh --target T --download DIR [--line L] [--python X.Y] [--platform P] [--preinstalled torch==V]
#
#   --line         the library line (default: $LINE, else recipe): recipe = the Ascend recipe's pins
#                  (diffusers 0.32.0, transformers 4.46.1, peft 0.13.2; FLUX.1, SD3.5); current =
#                  diffusers 0.42.1, transformers 5.24.0, peft 0.21.2 (FLUX.1, SD3.5 and the families
#                  that need it). Pins: constraints/<line>.txt. Each line gets its own environment.
#   --target       device stack to install for (default: detected; npu if npu-smi or CANN is present,
#                  cuda if nvidia-smi works, else cpu). torch-npu is installed ONLY for npu: on other
#                  machines it breaks `import torch`.
#   --venv DIR     virtual environment to create/use (default: .venv for the recipe line and
#                  .venv-current for the current line, in this folder, unless a virtualenv or conda
#                  environment is already active, which is then used as is).
#   --no-venv      install into the current Python environment.
#   --with-parity  also install the hpsv2 package (no deps) for the HPS parity test, and the
#                  aesthetic / ImageReward references (scripts/install_reward_parity.sh).
#   --force        reinstall even if the stamp says the environment is up to date.
#   --cann-version V  (npu) the CANN version to pair torch-npu with (default: read from the CANN tree).
#   --cann-home DIR   (npu) the CANN tree (default: $ASCEND_TOOLKIT_HOME, /usr/local/Ascend/cann,
#                  /usr/local/Ascend/ascend-toolkit/latest). Its set_env.sh is sourced before the check.
#                  torch_npu is imported as a check only where the NPU driver is (ASCEND_DRIVER_HOME,
#                  default /usr/local/Ascend/driver): an image build has none (docker/ascend.Dockerfile).
#   --wheelhouse DIR  install from DIR alone (pip --no-index), e.g. on a machine without internet.
#   --download DIR    fill DIR with every wheel the target needs and stop (nothing is installed);
#                  --python X.Y and --platform P (e.g. manylinux2014_aarch64) fetch them for another
#                  machine; --preinstalled torch==V leaves out a torch the target machine already has.
# Nothing is downloaded from a model hub: weights go to data/flux and hps_ckpt by hand (README).
# Exit status 2: a problem you fix, said in one line (a flag, the Python version, CANN, or another
# package named `fastvideo`, hao-ai-lab's FastVideo, installed in the environment: pip uninstall it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

TARGET=""
VENV=""
USE_VENV=1
PARITY=0
FORCE=0
CANN_VERSION=""
CANN_HOME=""
DOWNLOAD=""
WHEELHOUSE=""
DL_PYTHON=""
DL_PLATFORM=""
PREINSTALLED=()
LINE="${LINE:-recipe}"
need() { [ -n "${2:-}" ] || { echo "env_setup.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --target) need "$1" "${2:-}"; TARGET="$2"; shift 2 ;;
    --target=*) TARGET="${1#*=}"; shift ;;
    --venv) need "$1" "${2:-}"; VENV="$2"; shift 2 ;;
    --no-venv) USE_VENV=0; shift ;;
    --with-parity) PARITY=1; shift ;;
    --force) FORCE=1; shift ;;
    --cann-version) need "$1" "${2:-}"; CANN_VERSION="$2"; shift 2 ;;
    --cann-home) need "$1" "${2:-}"; CANN_HOME="$2"; shift 2 ;;
    --download) need "$1" "${2:-}"; DOWNLOAD="$2"; shift 2 ;;
    --wheelhouse) need "$1" "${2:-}"; WHEELHOUSE="$2"; shift 2 ;;
    --python) need "$1" "${2:-}"; DL_PYTHON="$2"; shift 2 ;;
    --platform) need "$1" "${2:-}"; DL_PLATFORM="$2"; shift 2 ;;
    --preinstalled) need "$1" "${2:-}"; PREINSTALLED+=("$2"); shift 2 ;;
    --line) need "$1" "${2:-}"; LINE="$2"; shift 2 ;;
    --line=*) LINE="${1#*=}"; shift ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "env_setup.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -n "$DOWNLOAD" ] && [ -n "$WHEELHOUSE" ]; then
  echo "env_setup.sh: --download and --wheelhouse exclude each other: download on a connected machine, install with --wheelhouse on the other" >&2; exit 2
fi
if [ -z "$DOWNLOAD" ] && { [ -n "$DL_PYTHON" ] || [ -n "$DL_PLATFORM" ] || [ "${#PREINSTALLED[@]}" -gt 0 ]; }; then
  echo "env_setup.sh: --python, --platform and --preinstalled only apply to --download DIR" >&2; exit 2
fi

if [ -z "$TARGET" ]; then
  if command -v npu-smi >/dev/null 2>&1 || [ -d /usr/local/Ascend/driver ]; then TARGET=npu
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then TARGET=cuda
  else TARGET=cpu; fi
  echo "env_setup.sh: detected target '$TARGET' (override with --target cpu|cuda|npu)"
fi
case "$TARGET" in cpu|cuda|npu) ;; *) echo "env_setup.sh: --target must be cpu, cuda or npu, not '$TARGET'" >&2; exit 2 ;; esac
case "$LINE" in recipe|current) ;; *) echo "env_setup.sh: --line must be recipe (diffusers 0.32, the default) or current (diffusers 0.42), not '$LINE'" >&2; exit 2 ;; esac
PLAN=(scripts/install_plan.py)
CONSTRAINTS="$ROOT/constraints/$LINE.txt"
CANN_ARGS=()
[ -n "$CANN_VERSION" ] && CANN_ARGS+=(--cann-version "$CANN_VERSION")
[ -n "$CANN_HOME" ] && CANN_ARGS+=(--cann-home "$CANN_HOME")

if [ -n "$DOWNLOAD" ]; then
  LINE="$LINE" exec bash "$ROOT/scripts/download_wheels.sh" "$TARGET" "$DOWNLOAD" "$PARITY" "$DL_PYTHON" "$DL_PLATFORM" \
    "${PREINSTALLED[*]:-}" "${CANN_ARGS[@]}"
fi

# Choose the Python environment.
if [ "$USE_VENV" = 1 ] && [ -z "$VENV" ] && [ -z "${VIRTUAL_ENV:-}" ] && [ -z "${CONDA_PREFIX:-}" ]; then
  if [ "$LINE" = recipe ]; then VENV="$ROOT/.venv"; else VENV="$ROOT/.venv-$LINE"; fi
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
PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$PYVER" in 3.[0-9]) echo "env_setup.sh: flux-grpo needs Python >= 3.10, $PY is $PYVER" >&2; exit 2 ;; esac

# Another project's `fastvideo` (hao-ai-lab's FastVideo is `fastvideo` on PyPI) in this environment
# shadows this one's: one line saying what to uninstall, exit 2 (fastvideo/import_name.py, standard library only).
"$PY" "$ROOT/fastvideo/import_name.py" --prefix env_setup.sh || exit $?
STAMP_DIR="$("$PY" -c 'import sys; print(sys.prefix)')"
STAMP="$STAMP_DIR/.flux_grpo_setup"
WANT="$TARGET line=$LINE parity=$PARITY${CANN_VERSION:+ cann=$CANN_VERSION} $(cat pyproject.toml "$CONSTRAINTS" scripts/install_hpsv2_parity.sh scripts/install_reward_parity.sh 2>/dev/null | cksum | cut -d' ' -f1)"
if [ "$FORCE" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import fastvideo, torch, diffusers" 2>/dev/null; then
  echo "env_setup.sh: environment up to date ($PY, target $TARGET, line $LINE)"
  exit 0
fi

# FLUX_GRPO_PIP replaces "python -m pip" (tests use a stand-in that records the commands).
if [ -n "${FLUX_GRPO_PIP:-}" ]; then PIP_CMD=("$FLUX_GRPO_PIP"); else PIP_CMD=("$PY" -m pip); fi
PIP=("${PIP_CMD[@]}" install --disable-pip-version-check)
if [ -n "$WHEELHOUSE" ]; then
  [ -d "$WHEELHOUSE" ] || { echo "env_setup.sh: --wheelhouse $WHEELHOUSE is not a folder (make one with --download)" >&2; exit 2; }
  # Every pip call below, install_hpsv2_parity.sh's included, reads the wheelhouse and nothing else.
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$(cd "$WHEELHOUSE" && pwd)"
  echo "env_setup.sh: installing from $PIP_FIND_LINKS only (pip --no-index)"
fi
SET_ENV=""
case "$TARGET" in
  npu)
    ARCH="${FLUX_GRPO_ARCH:-$(uname -m)}"  # FLUX_GRPO_ARCH: plan for another host (tests)
    # Python range, CANN version, torch-npu pairing and set_env.sh are all checked before pip runs.
    PLAN_OUT="$("$PY" "${PLAN[@]}" torch --target npu --line "$LINE" --python-version "$PYVER" --arch "$ARCH" "${CANN_ARGS[@]}")" || exit 2
    mapfile -t TORCH_ARGS <<< "$PLAN_OUT"
    SET_ENV="$("$PY" "${PLAN[@]}" set-env ${CANN_HOME:+--cann-home "$CANN_HOME"})" || exit 2
    echo "env_setup.sh: NPU stack for $ARCH, Python $PYVER, $LINE line: ${TORCH_ARGS[*]}"
    "${PIP[@]}" "${TORCH_ARGS[@]}"
    ;;
  cpu|cuda)
    # Keep an already-installed torch when it is in range; never install torch-npu here.
    if ! "$PY" -c 'import torch, torchvision' 2>/dev/null; then
      if [ -n "$WHEELHOUSE" ] && ! "$PY" -c 'import torch' 2>/dev/null && ! ls "$PIP_FIND_LINKS"/torch-[0-9]*.whl >/dev/null 2>&1; then
        echo "env_setup.sh: torch is neither installed in $PY nor in the wheelhouse (it was made with --preinstalled torch==...). Install torch first, or download the wheelhouse again without --preinstalled." >&2
        exit 2
      fi
      CPU_INDEX=()
      if [ "$TARGET" = cpu ] && [ -z "$WHEELHOUSE" ]; then
        # torch's CPU build where PyTorch's CPU index answers (0.2 GB instead of 5.8 GB of CUDA wheels).
        # Blank lines dropped: an unreachable index prints nothing, and an empty argument would reach pip.
        mapfile -t CPU_INDEX < <("$PY" "${PLAN[@]}" cpu-index | grep -v '^[[:space:]]*$' || true)
        if [ "${#CPU_INDEX[@]}" -ge 2 ]; then echo "env_setup.sh: torch's CPU build from ${CPU_INDEX[1]}";
        else echo "env_setup.sh: PyTorch's CPU index is not reachable: torch from the package index (its CUDA build, about 5.8 GB)"; fi
      fi
      "${PIP[@]}" "torch>=2.7.1,<2.15" "torchvision>=0.22.1" ${CPU_INDEX[@]+"${CPU_INDEX[@]}"}
    fi
    if "$PY" -c 'import torch_npu' 2>/dev/null; then
      echo "env_setup.sh: warning: torch_npu is installed in this $TARGET environment; it breaks 'import torch' without CANN. Remove it: $PY -m pip uninstall torch-npu" >&2
    fi
    ;;
esac
# The line's pins (constraints/<line>.txt) decide diffusers / transformers / peft; pyproject allows both lines.
echo "env_setup.sh: $LINE line ($(grep -E '^(diffusers|transformers|peft)==' "$CONSTRAINTS" | tr '\n' ' '))"
# The extras every environment gets (scripts/install_plan.py INSTALL_EXTRAS): test, and video (MP4 clips).
"${PIP[@]}" -e ".[test,video]" -c "$CONSTRAINTS"
if [ "$PARITY" = 1 ]; then
  PYTHON="$PY" bash "$ROOT/scripts/install_hpsv2_parity.sh"
fi
if [ -n "$SET_ENV" ]; then
  # torch-npu loads CANN's libraries at `import torch`: bring CANN in first (set_env.sh reads unset variables).
  set +u
  # shellcheck disable=SC1090
  source "$SET_ENV"
  set -u
  echo "env_setup.sh: sourced $SET_ENV"
  # torch_npu needs the NPU driver's libraries to import. A machine without the driver (an image build:
  # the driver is the host's, mounted at run time; a login node) installs it without the import check.
  DRIVER="${ASCEND_DRIVER_HOME:-/usr/local/Ascend/driver}"
  if [ -d "$DRIVER/lib64" ]; then
    CHECK_NPU="import torch_npu; "
  else
    echo "env_setup.sh: no NPU driver at $DRIVER (an image build or a machine without NPUs): torch_npu is installed but not imported here; the launchers import it on an NPU host (ASCEND_DRIVER_HOME names a driver elsewhere)"
  fi
fi
"$PY" -c "${CHECK_NPU:-}import fastvideo, torch, diffusers, transformers, open_clip; from fastvideo.library_lines import library_line; print('env_setup.sh: ok - torch', torch.__version__, '| diffusers', diffusers.__version__, '| transformers', transformers.__version__, '| line', library_line())"
echo "$WANT" > "$STAMP"
if [ "$TARGET" = npu ]; then
  cat <<MSG
env_setup.sh: NPU environment installed. Before running, bring in CANN:
    source $SET_ENV        # see scripts/npu_env.sh
The launchers in scripts/ do this for you (override the path with CANN_SET_ENV).
MSG
fi
