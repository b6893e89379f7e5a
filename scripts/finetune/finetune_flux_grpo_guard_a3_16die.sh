#!/usr/bin/env bash
# GRPO with GRPO-Guard's policy loss (--policy_loss grpo_guard, docs/objectives.md) for FLUX.1-dev on 16 devices:
# scripts/finetune/finetune_flux_grpo_a3_16die.sh (DanceGRPO's SDE, eta 0.3; every other flag its own) with the
# re-centred, normalised ratio and verl-omni's clip range (verl-project/verl-omni at a1139ba,
# docs/algo/grpo_guard.md: loss_mode=grpo_guard, clip_ratio=2e-6; GRPO-Guard's ratios stay within ~1e-6 of 1).
# DRY_RUN=1 prints the torchrun command. Overridable: CLIP_RANGE (2e-6), MASTER_PORT (19037), OUTPUT_DIR
# (data/outputs/grpo_guard) and every variable of the GRPO launcher.
set -euo pipefail
export POLICY_LOSS=grpo_guard CLIP_RANGE=${CLIP_RANGE:-2e-6} MASTER_PORT=${MASTER_PORT:-19037}
export OUTPUT_DIR=${OUTPUT_DIR:-data/outputs/grpo_guard}
exec bash "$(dirname "${BASH_SOURCE[0]}")/finetune_flux_grpo_a3_16die.sh"
