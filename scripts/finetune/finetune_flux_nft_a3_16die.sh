#!/usr/bin/env bash
# DiffusionNFT (--algorithm nft, docs/nft.md) for FLUX.1-dev on one node of 16 devices (GPUs or NPU dies): the
# reference's LoRA recipe translated to FLUX (scripts/finetune/nft_args.sh says how, flag by flag).
# DRY_RUN=1 prints the torchrun command. Overridable: NPROC (16), MASTER_PORT (19006), MODEL_PATH (data/flux),
# DATA_JSON, OUTPUT_DIR, HPS_DIR (hps_ckpt), NFT_GROUPS (48: 3 prompts per rank), GA (72: one optimizer
# step over all groups, the reference's), EXTRA_ARGS.
# Trained weights: LoRA adapters (--use_lora) in fp32 (--master_weight_type fp32, the default) over a frozen
# base, as DiffusionNFT's LoRA recipe (full fine-tuning's --trainable_modules does not apply).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
NPROC=${NPROC:-16}
NFT_FAMILY=flux
source scripts/finetune/nft_args.sh
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="$NPROC" --master_port="${MASTER_PORT:-19006}" \
  fastvideo/train_grpo_flux.py "${NFT_ARGS[@]}" "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
