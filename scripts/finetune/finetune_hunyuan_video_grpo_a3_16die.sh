#!/usr/bin/env bash
# DanceGRPO's GRPO for HunyuanVideo on one Atlas A3 node, 16 NPU dies (or a 16-GPU node), full fine-tuning, on
# either library line (LINE as scripts/common.sh resolves it).
# Its values and their sources: scripts/finetune/hunyuan_video_grpo_args.sh.
# 2 prompts per rank x 24 clips of 53 frames at 480x480 (32 prompts per iteration, as DanceGRPO's 32 GPUs x 1),
# the 8 best-of-24 (--bestofn 8) of each prompt train in micro-batches of 1 accumulated over 8: 2 optimizer
# steps per iteration, as DanceGRPO's. DRY_RUN=1 prints the
# torchrun command.
# Data: bash scripts/preprocess/preprocess_hunyuan_video_rl_embeddings.sh.
# Overridable (scripts/finetune/hunyuan_video_grpo_run.sh): NPROC (16), MASTER_PORT (19004), EXTRA_ARGS,
# and hunyuan_video_grpo_args.sh's MODEL_PATH, DATA_JSON, OUTPUT_DIR, REWARDS, ROLLOUT_BATCH_SIZE, NUM_FRAMES.
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as DanceGRPO's full fine-tuning; EXTRA_ARGS may choose otherwise.
PROMPTS_PER_RANK=2 ACCUMULATION=8 NPROC_DEFAULT=16
source "$(dirname "${BASH_SOURCE[0]}")/hunyuan_video_grpo_run.sh"
