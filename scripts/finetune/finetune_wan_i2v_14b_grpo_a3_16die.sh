#!/usr/bin/env bash
# Flow-Factory's GRPO for Wan2.1-I2V-14B (480P; MODEL_PATH a 720P folder) (image to video: each clip from its prompt's first frame, 5 frames at
# 240x240, the one transformer trained) on one Atlas A3 node, 16 NPU dies (or a 16-GPU node), full fine-tuning under FSDP2, on the current library line (LINE=current).
# Its values and their sources: scripts/finetune/wan_i2v_14b_grpo_args.sh.
# 3 prompts per rank x 16 clips (48 prompts per iteration, as Flow-Factory's unique_sample_num_per_epoch),
# micro-batches of 1 accumulated over 24: 2 optimizer steps per iteration, as its gradient_step_per_epoch.
# DRY_RUN=1 prints the torchrun command.
# Data: NUM_FRAMES=5 bash scripts/preprocess/preprocess_wan_i2v_rl_embeddings.sh (a JSONL of prompts with first frames).
# Overridable: NPROC (16), MASTER_PORT, EXTRA_ARGS (scripts/finetune/current_line_grpo.sh), and
# wan_i2v_14b_grpo_args.sh's MODEL_PATH, DATA_JSON, OUTPUT_DIR, REWARDS, ROLLOUT_BATCH_SIZE.
# Memory: python -m fastvideo.tools.cost_model --memory --model_family wan_i2v --model wan2.1-i2v-14b-480p (docs/wan.md).
ARGS_FILE=scripts/finetune/wan_i2v_14b_grpo_args.sh PROMPTS_PER_RANK=3 ACCUMULATION=24 NPROC_DEFAULT=16
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
