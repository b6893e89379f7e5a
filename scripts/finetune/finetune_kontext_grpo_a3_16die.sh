#!/usr/bin/env bash
# Flow-Factory's GRPO (PickScore) for FLUX.1 Kontext [dev] on an Atlas A3 node (16 dies), full
# fine-tuning, on the current library line. Values: scripts/finetune/kontext_grpo_args.sh. 3 prompts per
# rank x 16 images (48 prompts per iteration), micro-batches of 4 accumulated over 6: 2 optimizer steps
# per iteration. DRY_RUN=1 prints the torchrun command. Overridable as finetune_kontext_grpo_8gpus.sh.
# Trained weights: the args file's --trainable_modules and --master_weight_type (every weight, fp32 masters;
# why, and Flow-Factory's choices, there).
ARGS_FILE=scripts/finetune/kontext_grpo_args.sh PROMPTS_PER_RANK=3 ACCUMULATION=6 NPROC_DEFAULT=16
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
