#!/usr/bin/env bash
# Flow-Factory's GRPO (PickScore) for FLUX.1 Kontext [dev] on 8 devices (GPU or NPU, detected), full
# fine-tuning, on the current library line (LINE=current). Its values and their sources:
# scripts/finetune/kontext_grpo_args.sh. 6 prompts per rank x 16 images (48 prompts per iteration, as
# Flow-Factory's 48 per epoch), micro-batches of 4 accumulated over 12: 2 optimizer steps per iteration.
# DRY_RUN=1 prints the torchrun command. Data: an editing prompt file (docs/editing.md) preprocessed with
# --model_family kontext. Overridable: NPROC (8), MASTER_PORT, EXTRA_ARGS, and kontext_grpo_args.sh's variables.
# Trained weights: the args file's --trainable_modules and --master_weight_type (every weight, fp32 masters;
# why, and Flow-Factory's choices, there).
ARGS_FILE=scripts/finetune/kontext_grpo_args.sh PROMPTS_PER_RANK=6 ACCUMULATION=12 NPROC_DEFAULT=8
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
