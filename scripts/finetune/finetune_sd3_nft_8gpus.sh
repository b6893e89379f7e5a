#!/usr/bin/env bash
# DiffusionNFT (--algorithm nft, docs/nft.md) for Stable Diffusion 3.5-Medium on one node of 8 devices (GPUs or NPU dies): the
# reference's own SD3.5 LoRA recipe (NVlabs/DiffusionNFT config/nft.py; scripts/finetune/nft_args.sh names each
# value's source): no classifier-free guidance (guidance 1.0), the scheduler's timestep grid, 10 DPM-Solver++ 2M
# steps, 24 images per prompt, one optimizer step over 48 groups (6 prompts per rank), the EMA warmed up and
# exported. DRY_RUN=1 prints the torchrun command.
# Data: bash scripts/preprocess/preprocess_sd3_rl_embeddings.sh (T5 length 128, with the empty prompt).
# Overridable: NPROC (8), MASTER_PORT (19014), MODEL_PATH (data/sd3), DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR
# (data/pickscore), REWARDS, NFT_GROUPS (48), GA (144), EXTRA_ARGS.
# Trained weights: LoRA adapters (--use_lora) in fp32 (--master_weight_type fp32, the default) over a frozen
# base, as DiffusionNFT's LoRA recipe (full fine-tuning's --trainable_modules does not apply).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
NPROC=${NPROC:-8}
NFT_FAMILY=sd3
source scripts/finetune/nft_args.sh
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="$NPROC" --master_port="${MASTER_PORT:-19014}" \
  fastvideo/train_grpo_flux.py "${NFT_ARGS[@]}" "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
