#!/usr/bin/env bash
# Flow-Factory's NFT (PickScore) for FLUX.2 [klein] base on 8 devices (GPU or NPU, detected), full fine-tuning, on the
# current library line (LINE=current). Its values and their sources: scripts/finetune/flux2_klein_nft_args.sh.
# 6 prompts per rank x 16 images (48 prompts per iteration, as Flow-Factory's 48 per epoch), micro-batches
# of 4 accumulated over 24: one optimizer step per iteration, as its 1 per epoch. DRY_RUN=1 prints the
# torchrun command. Data: bash scripts/preprocess/preprocess_flux2_rl_embeddings.sh.
# Overridable: NPROC (8), MASTER_PORT, EXTRA_ARGS (scripts/finetune/current_line_grpo.sh), and
# flux2_klein_nft_args.sh's MODEL_PATH, DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR, ROLLOUT_BATCH_SIZE, REWARDS.
# Trained weights: the args file's --trainable_modules and --master_weight_type (every weight, fp32 masters;
# why, and Flow-Factory's choices, there).
ARGS_FILE=scripts/finetune/flux2_klein_nft_args.sh PROMPTS_PER_RANK=6 ACCUMULATION=24 NPROC_DEFAULT=8
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
