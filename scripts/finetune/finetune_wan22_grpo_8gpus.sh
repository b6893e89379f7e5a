#!/usr/bin/env bash
# verl-omni's DanceGRPO for Wan2.2-TI2V-5B (text to video, 9 frames at 704x1280) on 8 devices (GPU or NPU,
# detected), full fine-tuning, on the current library line (LINE=current).
# Its values and their sources: scripts/finetune/wan22_grpo_args.sh.
# 8 prompts per rank x 8 clips (64 prompts per iteration, as verl-omni's train_batch_size), micro-batches of 4
# accumulated over 4: 4 optimizer steps per iteration, as its 64 / ppo_mini_batch_size 16. DRY_RUN=1 prints
# the torchrun command.
# Data: MODEL_PATH=data/wan22 OUTPUT_DIR=data/rl_embeddings_wan22 bash
# scripts/preprocess/preprocess_wan_rl_embeddings.sh.
# Overridable: NPROC (8), MASTER_PORT, EXTRA_ARGS (scripts/finetune/current_line_grpo.sh), and
# wan22_grpo_args.sh's MODEL_PATH, DATA_JSON, OUTPUT_DIR, REWARDS, ROLLOUT_BATCH_SIZE.
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as verl-omni full fine-tuning; EXTRA_ARGS may choose otherwise.
ARGS_FILE=scripts/finetune/wan22_grpo_args.sh PROMPTS_PER_RANK=8 ACCUMULATION=4 NPROC_DEFAULT=8
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
