#!/usr/bin/env bash
# Build a patched diffusers for Ascend NPU and install it in editable mode.
#
#   bash scripts/apply_diffusers_patches.sh [--no-install] [--version VERSION] DIR
#
# VERSION is a release with a patch series in patches/diffusers-VERSION/: 0.32.0 (the recipe line,
# the default) or 0.42.1 (the current line). Fetches that release's source distribution from PyPI
# (pip download), unpacks it into DIR, commits it there as "vVERSION" (tagged vVERSION), applies
# patches/diffusers-VERSION/*.patch with `git am`, then runs `pip install -e DIR`.
#
# Environment:
#   PYTHON           interpreter whose pip is used (default: .venv/bin/python, else python3)
#   DIFFUSERS_SDIST  an already downloaded diffusers-VERSION.tar.gz to use instead of downloading
#
# DIR must not exist yet, or be empty. Without CANN the patched diffusers behaves exactly as the stock
# release, so installing it on GPU/CPU machines is harmless (and unnecessary).
set -euo pipefail

VERSION=0.32.0
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
    echo "usage: bash scripts/apply_diffusers_patches.sh [--no-install] [--version VERSION] DIR" >&2
    exit 2
}

install=1
target=""
while [ $# -gt 0 ]; do
    case "$1" in
        --no-install) install=0 ;;
        --version) [ $# -ge 2 ] || usage; VERSION="$2"; shift ;;
        --version=*) VERSION="${1#--version=}" ;;
        -h|--help) usage ;;
        -*) echo "unknown option: $1" >&2; usage ;;
        *) [ -z "$target" ] || usage; target="$1" ;;
    esac
    shift
done
[ -n "$target" ] || usage

PATCH_DIR="${REPO_ROOT}/patches/diffusers-${VERSION}"
if [ ! -d "$PATCH_DIR" ]; then
    series=$(cd "${REPO_ROOT}/patches" && ls -d diffusers-*/ 2>/dev/null | sed 's|^diffusers-||; s|/$||' | tr '\n' ' ')
    series="${series% }"
    echo "no patch series for diffusers ${VERSION} (patches/diffusers-${VERSION}/ does not exist);" \
        "use --version with one of: ${series:-none}" >&2
    exit 2
fi

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
