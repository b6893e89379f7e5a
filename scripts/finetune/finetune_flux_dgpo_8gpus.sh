#!/usr/bin/env bash
# DGPO (--algorithm dgpo) for FLUX.1-dev on one node of 8 devices (GPUs or NPU dies), docs/objectives.md: the peer's recipe
# translated to FLUX (scripts/finetune/objective_args.sh says how, flag by flag, with the file it cites).
# DRY_RUN=1 prints the torchrun command. Overridable: NPROC (8), MASTER_PORT (19032), MODEL_PATH (data/flux),
# DATA_JSON, OUTPUT_DIR (data/outputs/dgpo), REWARDS (pickscore:1.0), PICKSCORE_DIR, OBJ_GROUPS (prompt groups per
# optimizer step), GA, LEAN, EXTRA_ARGS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
NPROC=${NPROC:-8}
OBJ=dgpo
source scripts/finetune/objective_args.sh
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="$NPROC" --master_port="${MASTER_PORT:-19032}" \
  fastvideo/train_grpo_flux.py "${OBJ_ARGS[@]}" "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
