#!/usr/bin/env bash
# DanceGRPO's GRPO (HPSv2.1) for Wan2.1-T2V-1.3B on one Atlas A3 node, 16 NPU dies (or a 16-GPU node), full
# fine-tuning, on the current library line (LINE=current).
# Its values and their sources: scripts/finetune/wan21_grpo_args.sh.
# 1 prompt per rank x 12 samples (16 prompts per iteration, as DanceGRPO's 8 GPUs x 2), micro-batches of 1
# accumulated over 12: one optimizer step per iteration, as DanceGRPO's. DRY_RUN=1 prints the torchrun
# command.
# Data: bash scripts/preprocess/preprocess_wan_rl_embeddings.sh.
# Overridable: NPROC (16), MASTER_PORT, EXTRA_ARGS (scripts/finetune/current_line_grpo.sh), and
# wan21_grpo_args.sh's MODEL_PATH, DATA_JSON, OUTPUT_DIR, REWARDS, ROLLOUT_BATCH_SIZE, NUM_FRAMES.
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as DanceGRPO full fine-tuning; EXTRA_ARGS may choose otherwise.
ARGS_FILE=scripts/finetune/wan21_grpo_args.sh PROMPTS_PER_RANK=1 ACCUMULATION=12 NPROC_DEFAULT=16
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
