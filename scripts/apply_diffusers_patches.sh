#!/usr/bin/env bash
# Build a patched diffusers 0.32.0 for Ascend NPU and install it in editable mode.
#
#   bash scripts/apply_diffusers_patches.sh [--no-install] DIR
#
# Fetches diffusers 0.32.0's source distribution from PyPI (pip download), unpacks it into DIR,
# commits it there as "v0.32.0" (tagged v0.32.0), applies patches/diffusers/*.patch with `git am`,
# then runs `pip install -e DIR`.
#
# Environment:
#   PYTHON           interpreter whose pip is used (default: .venv/bin/python, else python3)
#   DIFFUSERS_SDIST  an already downloaded diffusers-0.32.0.tar.gz to use instead of downloading
#
# DIR must not exist yet, or be empty. Without CANN the patched diffusers behaves exactly as the stock
# release, so installing it on GPU/CPU machines is harmless (and unnecessary).
set -euo pipefail

VERSION=0.32.0
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PATCH_DIR="${REPO_ROOT}/patches/diffusers"

usage() {
    echo "usage: bash scripts/apply_diffusers_patches.sh [--no-install] DIR" >&2
    exit 2
}

install=1
target=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-install) install=0 ;;
        -h|--help) usage ;;
        -*) echo "unknown option: $1" >&2; usage ;;
        *) [ -z "$target" ] || usage; target="$1" ;;
    esac
    shift
done
[ -n "$target" ] || usage

if [ -z "${PYTHON:-}" ]; then
    if [ -x "${REPO_ROOT}/.venv/bin/python" ]; then
        PYTHON="${REPO_ROOT}/.venv/bin/python"
    else
        PYTHON="$(command -v python3 || true)"
    fi
fi
[ -n "${PYTHON}" ] || { echo "no python found: set PYTHON=/path/to/python" >&2; exit 1; }
command -v git >/dev/null || { echo "git is required (patches are applied with git am)" >&2; exit 1; }

if [ -e "$target" ] && [ -n "$(ls -A "$target" 2>/dev/null)" ]; then
    echo "target $target exists and is not empty: choose a new directory or remove it" >&2
    exit 1
fi

shopt -s nullglob
patches=("${PATCH_DIR}"/[0-9][0-9][0-9][0-9]-*.patch)
shopt -u nullglob
[ ${#patches[@]} -gt 0 ] || { echo "no patches found in ${PATCH_DIR}" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

sdist="${DIFFUSERS_SDIST:-}"
if [ -z "$sdist" ]; then
    echo "downloading diffusers ${VERSION} source distribution from PyPI"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "diffusers==${VERSION}" -d "$work"
    sdist="$work/diffusers-${VERSION}.tar.gz"
fi
[ -f "$sdist" ] || { echo "source distribution not found: $sdist" >&2; exit 1; }

# --no-same-owner: as root, tar would keep the archive's owner ids and git would then refuse the
# repository ("dubious ownership").
tar --no-same-owner -xzf "$sdist" -C "$work"
mkdir -p "$(dirname "$target")"
rm -rf "$target"
mv "$work/diffusers-${VERSION}" "$target"

# A fixed identity keeps the commits independent of the user's git configuration.
git_id=(-c user.name=flux_grpo -c user.email=flux_grpo@example.invalid -c commit.gpgsign=false)
(
    cd "$target"
    git init --quiet
    git add --all
    git "${git_id[@]}" commit --quiet -m "v${VERSION}"
    git tag "v${VERSION}"
    git "${git_id[@]}" am --quiet "${patches[@]}"
    echo "applied ${#patches[@]} patches onto v${VERSION} in $(pwd):"
    git log --oneline "v${VERSION}..HEAD"
)

if [ "$install" -eq 1 ]; then
    "$PYTHON" -m pip install -e "$target"
    echo "installed patched diffusers from $target"
else
    echo "not installed (--no-install); to install: $PYTHON -m pip install -e $target"
fi
