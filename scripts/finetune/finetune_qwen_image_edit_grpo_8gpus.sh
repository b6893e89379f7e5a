#!/usr/bin/env bash
# Flow-Factory's GRPO (PickScore) for Qwen-Image-Edit-2509 / -2511 on 8 devices (GPU or NPU, detected), full
# fine-tuning, on the current library line (LINE=current). Its values and their sources:
# scripts/finetune/qwen_image_edit_grpo_args.sh. 6 prompts per rank x 16 images (48 prompts per iteration, as
# Flow-Factory's 48 per epoch), micro-batches of 2 accumulated over 24: 2 optimizer steps per iteration.
# DRY_RUN=1 prints the torchrun command. Data: an editing prompt file (docs/editing.md) preprocessed with
# --model_family qwen_image_edit. Overridable: NPROC (8), MASTER_PORT, EXTRA_ARGS, and the args file's variables.
# Memory (cost model, docs/editing.md): 55.6 GB peak per device with sources preprocessed at 384^2 (63.4 GB at
# 1024^2): fits 80 GB and 141 GB GPUs.
# Trained weights: the args file's --trainable_modules and --master_weight_type (every weight, fp32 masters;
# why, and Flow-Factory's choices, there).
ARGS_FILE=scripts/finetune/qwen_image_edit_grpo_args.sh PROMPTS_PER_RANK=6 ACCUMULATION=24 NPROC_DEFAULT=8
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
