#!/usr/bin/env bash
# Flow-Factory's GRPO (CLIP + PickScore) for FLUX.2 [dev] (32B) on one Atlas A3 node, 16 NPU dies of 64 GB (or a
# 16-GPU node), full fine-tuning, on the current library line (LINE=current: .venv-current). Its values and
# their sources: scripts/finetune/flux2_dev_grpo_args.sh. 3 prompts per rank x 16 images (48 prompts per
# iteration), micro-batches of 1 accumulated over 24: 2 optimizer steps per iteration.
# Memory (docs/flux2.md): 61.0 GB per die on the device alone (3 GB short of the margin the framework's
# context needs), so FSDP's shards live on the host by default (OFFLOAD=1: 28.8 GB per die).
# DRY_RUN=1 prints the torchrun command.
# Data: bash scripts/preprocess/preprocess_flux2_dev_rl_embeddings.sh (Mistral-3, 512 tokens).
# Overridable: NPROC (16), MASTER_PORT (19003), EXTRA_ARGS, OFFLOAD (1), and flux2_dev_grpo_args.sh's
# MODEL_PATH, DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR, CLIP_DIR, REWARDS, ROLLOUT_BATCH_SIZE.
# Trained weights: the args file's --trainable_modules and --master_weight_type (every weight, fp32 masters;
# why, and Flow-Factory's choices, there).
ARGS_FILE=scripts/finetune/flux2_dev_grpo_args.sh PROMPTS_PER_RANK=3 ACCUMULATION=24 NPROC_DEFAULT=16 OFFLOAD_DEFAULT=1
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
