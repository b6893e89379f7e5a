#!/usr/bin/env bash
# Fill a folder with every wheel a target needs, for an install without internet (env_setup.sh
# --wheelhouse DIR). Called by `env_setup.sh --download DIR`; see its --help for the options.
#   bash scripts/download_wheels.sh TARGET DIR PARITY(0|1) PYTHON_X.Y PLATFORM "torch==V ..." [--cann-version V | --cann-home D]
# PYTHON_X.Y and PLATFORM may be empty (this machine's); the preinstalled list may be empty.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TARGET="$1"; DEST="$2"; PARITY="$3"; PYVER="$4"; PLATFORM="$5"; read -r -a PREINSTALLED <<< "${6:-}"
shift 6
CANN_ARGS=("$@")

# Any Python with pip can download for any other: prefer the project's, then python3.
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY=python3; fi
[ -n "$PYVER" ] || PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$PLATFORM" in
  "") ARCH="$(uname -m)" ;;
  *aarch64*) ARCH=aarch64 ;;
  *x86_64*) ARCH=x86_64 ;;
  *) echo "env_setup.sh: --platform $PLATFORM: give a manylinux tag such as manylinux2014_x86_64 or manylinux2014_aarch64" >&2; exit 2 ;;
esac
if [ "$TARGET" = npu ] && [ "${#CANN_ARGS[@]}" = 0 ] && ! "$PY" scripts/install_plan.py cann-version >/dev/null 2>&1; then
  echo "env_setup.sh: --download for npu on a machine without CANN: name the target's CANN version, e.g. --cann-version 8.5.0" >&2
  exit 2
fi
PLAN_OUT="$("$PY" scripts/install_plan.py torch --target "$TARGET" --line "${LINE:-recipe}" --python-version "$PYVER" --arch "$ARCH" "${CANN_ARGS[@]}")" || exit 2
mapfile -t TORCH_ARGS <<< "$PLAN_OUT"
PARITY_FLAG=()
[ "$PARITY" = 1 ] && PARITY_FLAG=(--with-parity)
mapfile -t PROJECT_REQS < <("$PY" scripts/install_plan.py project --line "${LINE:-recipe}" "${PARITY_FLAG[@]}")

mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
CROSS=()
if [ -n "$PLATFORM" ] || [ "$PYVER" != "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ]; then
  # For another machine pip can only take wheels (it cannot build sdists for a foreign platform).
  CROSS=(--only-binary=:all: --python-version "$PYVER" --implementation cp)
  if [ -n "$PLATFORM" ]; then
    for tag in $("$PY" scripts/install_plan.py platform-tags "$PLATFORM"); do CROSS+=(--platform "$tag"); done
  fi
fi
# A package the target already has (torch on an accelerator box) is stood in for by an empty wheel of
# the same version, so the resolver picks matching packages (torchvision pins torch) without fetching it.
STUB_ARGS=(--find-links "$WORK/stubs" -c "$WORK/constraints.txt")
: > "$WORK/constraints.txt"
stand_in() {  # stand_in NAME VERSION: resolve against an empty NAME==VERSION instead of the real one
  "$PY" scripts/install_plan.py stub-wheel "$WORK/stubs" "$1" "${2%%+*}+preinstalled" >/dev/null
  echo "$1==${2%%+*}+preinstalled" >> "$WORK/constraints.txt"
}
drop_pin() {  # drop_pin NAME: remove NAME's pin from TORCH_ARGS
  local a kept=()
  for a in "${TORCH_ARGS[@]}"; do case "$a" in "$1"==*|"$1"\>*|"$1"\<*) ;; *) kept+=("$a") ;; esac; done
  TORCH_ARGS=("${kept[@]}")
}
for spec in "${PREINSTALLED[@]}"; do
  case "$spec" in *==*) ;; *) echo "env_setup.sh: --preinstalled '$spec' must be NAME==VERSION (e.g. torch==2.7.1)" >&2; exit 2 ;; esac
  stand_in "${spec%%==*}" "${spec#*==}"
  drop_pin "${spec%%==*}"
done
INDEX_ARGS=()
for i in "${!TORCH_ARGS[@]}"; do
  [ "${TORCH_ARGS[$i]}" = --extra-index-url ] && INDEX_ARGS=(--extra-index-url "${TORCH_ARGS[$((i + 1))]}")
done
TORCH_DEPS=()
if [ "${#CROSS[@]}" -gt 0 ]; then
  # pip evaluates dependency markers for THIS machine even with --platform (it would fetch x86_64's
  # triton for an aarch64 host): fetch the torch stack alone, read its dependencies for the target,
  # and resolve the rest against stand-ins of the stack.
  STACK=()
  for a in "${TORCH_ARGS[@]}"; do case "$a" in torch==*|torchvision==*|torch-npu==*|"torch>"*|"torchvision>"*) STACK+=("$a") ;; esac; done
  if [ "${#STACK[@]}" -gt 0 ]; then
    mkdir -p "$WORK/stack"
    "$PY" -m pip download --disable-pip-version-check --no-deps --dest "$WORK/stack" "${CROSS[@]}" "${INDEX_ARGS[@]}" "${STACK[@]}"
    for whl in "$WORK"/stack/*.whl; do
      base="$(basename "$whl")"; name="${base%%-*}"; version="${base#*-}"; version="${version%%-*}"
      mapfile -t -O "${#TORCH_DEPS[@]}" TORCH_DEPS < <("$PY" scripts/install_plan.py wheel-deps "$whl" --python-version "$PYVER" --arch "$ARCH")
      stand_in "${name//_/-}" "$version"
      drop_pin "${name//_/-}"
      mv "$whl" "$DEST/"
    done
  fi
fi
echo "env_setup.sh: downloading the $TARGET wheels for Python $PYVER ${PLATFORM:-($(uname -m))} into $DEST"
"$PY" -m pip download --disable-pip-version-check --dest "$DEST" "${CROSS[@]}" "${STUB_ARGS[@]}" \
  "${TORCH_ARGS[@]}" "${TORCH_DEPS[@]}" "${PROJECT_REQS[@]}"
if [ "$PARITY" = 1 ]; then
  # hpsv2 goes in with --no-deps (its pins break environments); clint and its one dependency ship
  # only as sources, which are platform-independent and built on the target from the wheelhouse's setuptools.
  "$PY" -m pip download --disable-pip-version-check --dest "$DEST" --no-deps "${CROSS[@]}" hpsv2==1.2.0
  "$PY" -m pip download --disable-pip-version-check --dest "$DEST" --no-deps --no-binary=:all: clint args
fi
rm -f "$DEST"/*+preinstalled-py3-none-any.whl
cat > "$DEST/FLUX_GRPO_WHEELHOUSE.txt" <<INFO
target=$TARGET python=$PYVER platform=${PLATFORM:-$(uname -m)} parity=$PARITY preinstalled=${PREINSTALLED[*]:-none}
INFO
echo "env_setup.sh: $(ls "$DEST" | grep -c -E '\.(whl|tar\.gz|zip)$') files, $(du -sh "$DEST" | cut -f1) in $DEST. On the other machine:"
echo "    bash env_setup.sh --target $TARGET --line ${LINE:-recipe} --wheelhouse $DEST$([ "$PARITY" = 1 ] && echo ' --with-parity')"
