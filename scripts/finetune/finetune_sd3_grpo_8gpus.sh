#!/usr/bin/env bash
# Flow-GRPO (PickScore) for Stable Diffusion 3.5-Medium on 8 devices (GPU or NPU, detected): Flow-GRPO's
# configuration (scripts/finetune/sd3_grpo_args.sh names each value's source). One prompt per rank,
# 24 images each (8 prompts, 192 images per iteration), micro-batches of 4 with accumulation
# 3: 2 optimizer steps per iteration, as Flow-GRPO's 2 per epoch. DRY_RUN=1 prints the torchrun command.
# Data: bash scripts/preprocess/preprocess_sd3_rl_embeddings.sh (T5 length 128, with the empty prompt).
# Overridable: NPROC (8), MASTER_PORT (19002), EXTRA_ARGS, and sd3_grpo_args.sh's MODEL_PATH, DATA_JSON,
# OUTPUT_DIR, PICKSCORE_DIR, ROLLOUT_BATCH_SIZE.
# Trained weights: LoRA adapters (--use_lora) in fp32 (--master_weight_type fp32, the default) over a frozen
# base, as Flow-GRPO's LoRA recipe (full fine-tuning's --trainable_modules does not apply).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
source scripts/finetune/sd3_grpo_args.sh
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="${NPROC:-8}" --master_port="${MASTER_PORT:-19002}" \
  fastvideo/train_grpo_flux.py "${SD3_GRPO_ARGS[@]}" "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
