#!/usr/bin/env bash
# MixGRPO (FLASH=1: MixGRPO-Flash, FLASH=star: MixGRPO-Flash*) on one node of 8 devices (GPUs or NPU dies); the flags are
# scripts/finetune/mixgrpo_args.sh, as for the 16-die launcher. DRY_RUN=1 prints the torchrun
# command. Overridable: NPROC (8), MASTER_PORT (19004), MODEL_PATH (data/flux), DATA_JSON,
# OUTPUT_DIR, HPS_DIR (hps_ckpt), IMAGE_REWARD_DIR (image_reward_ckpt), PICKSCORE_DIR (data/pickscore),
# REWARD_MODEL (multi_reward, MixGRPO's), UNIFIED_REWARD_URL (None), FLASH (0), EXTRA_ARGS.
# One node: each optimizer step averages a quarter of MixGRPO's 4 x 8-GPU samples (mixgrpo_args.sh).
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as MixGRPO's full fine-tuning; EXTRA_ARGS may choose otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
source scripts/finetune/mixgrpo_args.sh
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="${NPROC:-8}" --master_port="${MASTER_PORT:-19004}" \
  fastvideo/train_grpo_flux.py "${MIXGRPO_ARGS[@]}" "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
