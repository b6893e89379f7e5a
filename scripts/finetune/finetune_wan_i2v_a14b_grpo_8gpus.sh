#!/usr/bin/env bash
# Flow-Factory's GRPO for Wan2.2-I2V-A14B's two experts (image to video: each clip from its prompt's first frame, 5 frames at
# 256x256, the high-noise expert trained, the low-noise one frozen: TRAIN_EXPERTS=high,low trains both) on 8 devices (GPU or NPU, detected), full fine-tuning under FSDP2, on the current library line (LINE=current).
# Its values and their sources: scripts/finetune/wan_i2v_a14b_grpo_args.sh.
# 6 prompts per rank x 16 clips (48 prompts per iteration, as Flow-Factory's unique_sample_num_per_epoch),
# micro-batches of 1 accumulated over 48: 2 optimizer steps per iteration, as its gradient_step_per_epoch.
# DRY_RUN=1 prints the torchrun command.
# Data: MODEL_PATH=data/wan_i2v_a14b OUTPUT_DIR=data/rl_embeddings_wan_i2v_a14b NUM_FRAMES=5 bash scripts/preprocess/preprocess_wan_i2v_rl_embeddings.sh (a JSONL of prompts with first frames).
# Overridable: NPROC (8), MASTER_PORT, EXTRA_ARGS (scripts/finetune/current_line_grpo.sh), and
# wan_i2v_a14b_grpo_args.sh's MODEL_PATH, DATA_JSON, OUTPUT_DIR, REWARDS, TRAIN_EXPERTS, ROLLOUT_BATCH_SIZE.
# Memory: python -m fastvideo.tools.cost_model --memory --model_family wan_i2v --model wan2.2-i2v-a14b (docs/wan.md).
ARGS_FILE=scripts/finetune/wan_i2v_a14b_grpo_args.sh PROMPTS_PER_RANK=6 ACCUMULATION=48 NPROC_DEFAULT=8
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
