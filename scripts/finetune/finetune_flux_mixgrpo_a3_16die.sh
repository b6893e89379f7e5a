#!/usr/bin/env bash
# MixGRPO for FLUX.1-dev on one Atlas A3 node, 16 NPU dies: SDE only inside a 4-step window that
# slides from high to low noise (one step every ITERS_PER_GROUP iterations), Euler ODE elsewhere,
# the window's 4 steps trained. FLASH=1 is MixGRPO-Flash: the ODE after the window runs with
# DPM-Solver++ (2nd order, midpoint) on 40 % of the steps, and the window moves every 20 iterations;
# FLASH=star is MixGRPO-Flash*: the window stays at the first 4 steps, the DPM tail keeps 20 %.
# Settings from Tencent-Hunyuan/MixGRPO scripts/finetune/finetune_flux_grpo_MixGRPO{,_Flash,_Flash*}.sh.
# REWARD_MODEL is MixGRPO's multi_reward by default (HPSv2.1 + ImageReward + PickScore, + UnifiedReward
# with UNIFIED_REWARD_URL; also hpsv2, image_reward, pick_score, clip_score, hpsv2_clip_score; see
# docs/rewards.md for their weights folders). One node of 16: each optimizer step averages half of
# MixGRPO's 4 x 8-GPU samples (mixgrpo_args.sh). Same script on a 16-GPU CUDA node. DRY_RUN=1 prints
# the torchrun command. Overridable: NPROC (16), MASTER_PORT (19003), MODEL_PATH (data/flux),
# DATA_JSON, OUTPUT_DIR, HPS_DIR (hps_ckpt), IMAGE_REWARD_DIR (image_reward_ckpt), PICKSCORE_DIR
# (data/pickscore), REWARD_MODEL (multi_reward), UNIFIED_REWARD_URL (None), FLASH (0), EXTRA_ARGS.
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as MixGRPO's full fine-tuning; EXTRA_ARGS may choose otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
source scripts/finetune/mixgrpo_args.sh
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="${NPROC:-16}" --master_port="${MASTER_PORT:-19003}" \
  fastvideo/train_grpo_flux.py "${MIXGRPO_ARGS[@]}" "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
