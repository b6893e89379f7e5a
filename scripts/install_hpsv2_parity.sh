#!/usr/bin/env bash
# Install the hpsv2 reference package, used ONLY by the HPS parity test
# (tests/rewards/test_reward_hps_parity.py). The trainer never imports hpsv2: fastvideo/rewards/hps.py
# scores with open_clip_torch directly.
#
# Why not a plain `pip install hpsv2`: hpsv2 1.2.0 pins pytest==7.2.0 and protobuf<4, which break
# the environment, so it goes in with --no-deps plus the few modules it really imports. Its wheel
# also lacks its tokenizer vocabulary (hpsv2/src/open_clip/bpe_simple_vocab_16e6.txt.gz); the
# identical file ships inside open_clip_torch and is copied across.
#
# Idempotent: re-running changes nothing once everything is in place.
# Usage: PYTHON=/path/to/python bash scripts/install_hpsv2_parity.sh
#        (default: <repo>/.venv/bin/python)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
if ! "$PYTHON" -c "import sys" 2>/dev/null; then
    echo "install_hpsv2_parity.sh: no usable python at '$PYTHON'; set PYTHON=/path/to/python" >&2
    exit 1
fi

# Modules hpsv2 imports at `import hpsv2` / `import hpsv2.img_score` time (same list as the
# [hpsv2] extra in pyproject.toml). requests, huggingface_hub, torchvision and open_clip_torch
# come with the main install.
if ! "$PYTHON" -c "import clint, ftfy, regex, braceexpand, webdataset, pandas" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet clint ftfy regex braceexpand webdataset pandas
fi

if ! "$PYTHON" - <<'PY' 2>/dev/null
import importlib.metadata as md, sys
sys.exit(0 if md.version("hpsv2") == "1.2.0" else 1)
PY
then
    "$PYTHON" -m pip install --quiet --no-deps "hpsv2==1.2.0"
fi

# Copy the BPE vocabulary without importing hpsv2 (its tokenizer module reads the file at import).
"$PYTHON" - <<'PY'
import hashlib
import importlib.util
import shutil
from pathlib import Path

name = "bpe_simple_vocab_16e6.txt.gz"
src = Path(importlib.util.find_spec("open_clip").origin).parent / name
dst = Path(importlib.util.find_spec("hpsv2").origin).parent / "src" / "open_clip" / name
if not src.is_file():
    raise SystemExit(f"open_clip_torch has no {src}; reinstall open_clip_torch")


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


if not dst.is_file() or digest(dst) != digest(src):
    shutil.copyfile(src, dst)
    print(f"copied {name} -> {dst}")
PY

# hpsv2's bundled open_clip does `from turtle import forward` (a stray import), so the python
# must have tkinter; say so plainly instead of failing later inside the test.
err_file="$(mktemp)"
trap 'rm -f "$err_file"' EXIT
if ! "$PYTHON" -W ignore -c "import hpsv2.img_score" 2>"$err_file"; then
    echo "install_hpsv2_parity.sh: hpsv2 installed but 'import hpsv2.img_score' fails:" >&2
    cat "$err_file" >&2
    if grep -q -i "tkinter\|turtle" "$err_file"; then
        echo "hpsv2 imports the 'turtle' module, which needs tkinter: install your OS's python3-tk" >&2
        echo "(the parity test stubs 'turtle' when it is missing, so the test still runs)." >&2
    else
        exit 1
    fi
fi
echo "hpsv2 1.2.0 ready for the HPS parity test ($("$PYTHON" -c 'import sys; print(sys.executable)'))"

# The aesthetic and ImageReward parity references.
PYTHON="$PYTHON" bash "$REPO/scripts/install_reward_parity.sh"
