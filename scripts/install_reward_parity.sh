#!/usr/bin/env bash
# Install the reference packages of the aesthetic and ImageReward parity tests
# (tests/rewards/test_reward_aesthetic_parity.py, test_reward_imagereward_parity.py). Called by
# scripts/install_hpsv2_parity.sh; the trainer never imports any of them.
#
# Everything goes in with --no-deps so the pinned torch / transformers are never touched:
# - openai-clip 1.0.1: OpenAI's `clip` package (the aesthetic predictor's CLIP). Pure Python; needs
#   ftfy, regex, tqdm (already present through the hpsv2 deps and the main install).
# - image-reward 1.5: its BLIP scorer. Its own pins (timm==0.6.13, transformers==4.27.4...) would
#   replace our versions; the parity test imports only ImageReward/ImageReward.py and models/BLIP,
#   which need timm (installed) and fairscale (added here, also --no-deps: it needs only torch and
#   numpy).
# Idempotent. Usage: PYTHON=/path/to/python bash scripts/install_reward_parity.sh
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"

want() {  # want DIST VERSION: install DIST==VERSION --no-deps unless already that version
    if ! "$PYTHON" - "$1" "$2" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
sys.exit(0 if md.version(sys.argv[1]) == sys.argv[2] else 1)
PY
    then
        "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps "$1==$2"
    fi
}

if ! "$PYTHON" -c "import ftfy, regex, tqdm, timm" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet --disable-pip-version-check ftfy regex tqdm "timm>=0.9"
fi
want openai-clip 1.0.1
want fairscale 0.4.13
want image-reward 1.5
# What the parity test imports of image-reward must import here (its package __init__ is bypassed).
"$PYTHON" -W ignore - "$REPO/tests/rewards" <<'PY'
import importlib.util, sys, types
from pathlib import Path
sys.path.insert(0, sys.argv[1])  # tests/rewards: the transformers-5 import shims the parity test applies too
from reference_shims import apply_transformers5_shims
apply_transformers5_shims()
root = Path(importlib.util.find_spec("ImageReward").origin).parent
for name, folder in (("ImageReward", root), ("ImageReward.models", root / "models")):
    stub = types.ModuleType(name); stub.__path__ = [str(folder)]; sys.modules[name] = stub
import ImageReward.ImageReward  # noqa: F401  (BLIP: timm, fairscale, transformers)
PY
echo "reward parity references ready ($("$PYTHON" -c 'import sys; print(sys.executable)'))"
