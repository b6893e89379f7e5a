#!/usr/bin/env bash
# Flow-Factory's NFT for Qwen-Image on 8 devices (GPU or NPU, detected), LoRA (rank 64), on the current library
# line (LINE=current). Its values and their sources: scripts/finetune/qwen_image_nft_args.sh (PickScore stands in
# for Flow-Factory's RationalRewards VLM). 4 prompts per rank x 16 images (32 prompts per iteration, as
# Flow-Factory's 32 per epoch), micro-batches of 2 accumulated over 32: one optimizer step per iteration, as its
# 1 per epoch. DRY_RUN=1 prints the torchrun command. Data: bash scripts/preprocess/preprocess_qwen_image_rl_embeddings.sh.
# Overridable: NPROC (8), MASTER_PORT, EXTRA_ARGS (scripts/finetune/current_line_grpo.sh), and
# qwen_image_nft_args.sh's MODEL_PATH, DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR, ROLLOUT_BATCH_SIZE, REWARDS.
# Trained weights: LoRA adapters in fp32 (--master_weight_type fp32; Flow-Factory's are bf16, why fp32 here: the
# args file) over a frozen base (full fine-tuning's --trainable_modules does not apply).
ARGS_FILE=scripts/finetune/qwen_image_nft_args.sh PROMPTS_PER_RANK=4 ACCUMULATION=32 NPROC_DEFAULT=8
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
