#!/usr/bin/env bash
# Flow-Factory's GRPO (CLIP + PickScore) for FLUX.2 [dev] (32B) on 8 GPUs, full fine-tuning, on the current
# library line (LINE=current: .venv-current, bash env_setup.sh --line current). Its values and their sources:
# scripts/finetune/flux2_dev_grpo_args.sh. 6 prompts per rank x 16 images (48 prompts per iteration, as
# Flow-Factory's 48 per epoch), micro-batches of 1 accumulated over 48: 2 optimizer steps per iteration.
# Memory (docs/flux2.md): 95 GB per GPU with full sharding and checkpointing: fits a 141 GB GPU as it is
# (OFFLOAD=0, the default); an 80 GB GPU needs OFFLOAD=1 (FSDP's shards on the host: 31 GB per GPU).
# DRY_RUN=1 prints the torchrun command.
# Data: bash scripts/preprocess/preprocess_flux2_dev_rl_embeddings.sh (Mistral-3, 512 tokens).
# Overridable: NPROC (8), MASTER_PORT (19003), EXTRA_ARGS, OFFLOAD (0), and flux2_dev_grpo_args.sh's
# MODEL_PATH, DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR, CLIP_DIR, REWARDS, ROLLOUT_BATCH_SIZE.
# Trained weights: the args file's --trainable_modules and --master_weight_type (every weight, fp32 masters;
# why, and Flow-Factory's choices, there).
ARGS_FILE=scripts/finetune/flux2_dev_grpo_args.sh PROMPTS_PER_RANK=6 ACCUMULATION=48 NPROC_DEFAULT=8 OFFLOAD_DEFAULT=0
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
