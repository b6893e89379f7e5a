#!/usr/bin/env bash
# Encode the RL prompts for a registered family with its defaults (fastvideo/models/catalog.py: one
# line a family): MODEL_PATH data/FAMILY, OUTPUT_DIR data/rl_embeddings_FAMILY, the family's
# MAX_SEQ_LEN, PROMPT_FILE and library line, each unless set, and its flags (--model_family FAMILY ...).
#
#   bash scripts/preprocess/preprocess_family_rl_embeddings.sh FAMILY [extra flags for preprocess_embeddings.py]
#
# The per-family launchers (preprocess_FAMILY_rl_embeddings.sh) are this with their family; every
# other variable: preprocess_flux_rl_embeddings.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
FAMILY=${1:?usage: preprocess_family_rl_embeddings.sh FAMILY [flags]}
shift
# Standard library only: any Python reads the catalog (common.sh picks the line's one afterwards).
DEFAULTS=$(cd "$ROOT" && "${PYTHON:-python3}" -m fastvideo.models.catalog preprocess "$FAMILY")
eval "$DEFAULTS"
exec bash "$ROOT/scripts/preprocess/preprocess_flux_rl_embeddings.sh" "${FAMILY_FLAGS[@]}" "$@"
