#!/usr/bin/env bash
# Flow-Factory's GRPO for Qwen-Image-Edit-2509 / -2511 on an Atlas A3 node's 16 dies: 3 prompts per rank x 16
# images (48 per iteration), micro-batches of 2 accumulated over 12: 2 optimizer steps per iteration.
# DRY_RUN=1 prints the torchrun command. Overridable as finetune_qwen_image_edit_grpo_8gpus.sh.
# Memory (cost model, docs/editing.md): 35.8 GB peak per die with sources preprocessed at 384^2 (43.7 GB at
# 1024^2): fits a 64 GB die.
# Trained weights: the args file's --trainable_modules and --master_weight_type (every weight, fp32 masters;
# why, and Flow-Factory's choices, there).
ARGS_FILE=scripts/finetune/qwen_image_edit_grpo_args.sh PROMPTS_PER_RANK=3 ACCUMULATION=12 NPROC_DEFAULT=16
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
