#!/usr/bin/env bash
# DanceGRPO's GRPO (HPSv2.1) for Wan2.1-T2V-1.3B on 8 devices (GPU or NPU, detected), full fine-tuning, on the
# current library line (LINE=current).
# Its values and their sources: scripts/finetune/wan21_grpo_args.sh.
# 2 prompts per rank x 12 samples (16 prompts per iteration, as DanceGRPO's 8 GPUs x 2), micro-batches of 1
# accumulated over 24: one optimizer step per iteration, as DanceGRPO's. DRY_RUN=1 prints the torchrun
# command.
# Data: bash scripts/preprocess/preprocess_wan_rl_embeddings.sh.
# Overridable: NPROC (8), MASTER_PORT, EXTRA_ARGS (scripts/finetune/current_line_grpo.sh), and
# wan21_grpo_args.sh's MODEL_PATH, DATA_JSON, OUTPUT_DIR, REWARDS, ROLLOUT_BATCH_SIZE, NUM_FRAMES.
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as DanceGRPO full fine-tuning; EXTRA_ARGS may choose otherwise.
ARGS_FILE=scripts/finetune/wan21_grpo_args.sh PROMPTS_PER_RANK=2 ACCUMULATION=24 NPROC_DEFAULT=8
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
