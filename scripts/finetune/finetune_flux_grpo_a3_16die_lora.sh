#!/usr/bin/env bash
# LoRA GRPO for FLUX.1-dev on one Atlas A3 node, 16 NPU dies: the Ascend recipe's schedule
# (GBS 64 = 1 x 4 accumulation x 16 dies, 16 sampling steps: finetune_flux_grpo_a3_16die.sh, run
# through fastvideo/train_grpo_flux_lora.py) with upstream's LoRA settings (r 128, alpha 256,
# lr 3e-4). Frozen bf16 base + fp32 adapters: fits 64 GB dies with room to spare
# (docs/performance.md). Runs unchanged on a 16-GPU CUDA node. DRY_RUN=1 prints the torchrun command.
# Overridable: as finetune_flux_grpo_a3_16die.sh; OUTPUT_DIR defaults to data/outputs/grpo_lora and
# EXTRA_ARGS comes after the LoRA settings (e.g. EXTRA_ARGS="--kl_coef 0.01" for a KL penalty to the base).
# Trained weights: the LoRA adapters in fp32 (--master_weight_type fp32, the default) over a frozen base, as
# upstream's LoRA script.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export TRAIN_SCRIPT=fastvideo/train_grpo_flux_lora.py
export OUTPUT_DIR="${OUTPUT_DIR:-data/outputs/grpo_lora}"
export EXTRA_ARGS="--learning_rate 3e-4 --lora_alpha 256 --lora_rank 128 ${EXTRA_ARGS:-}"
exec bash "$HERE/finetune_flux_grpo_a3_16die.sh"
