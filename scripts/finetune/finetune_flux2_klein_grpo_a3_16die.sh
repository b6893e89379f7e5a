#!/usr/bin/env bash
# Flow-Factory's GRPO (PickScore) for FLUX.2 [klein] on one Atlas A3 node, 16 NPU dies (or a 16-GPU node), full fine-tuning, on the
# current library line (LINE=current: .venv-current, bash env_setup.sh --line current). Its values and their
# sources: scripts/finetune/flux2_klein_grpo_args.sh. 3 prompts per rank x 16 images (48 prompts per
# iteration, as Flow-Factory's 48 per epoch), micro-batches of 4 accumulated over 6: 2 optimizer steps per
# iteration, as its 2 per epoch. DRY_RUN=1 prints the torchrun command.
# Data: bash scripts/preprocess/preprocess_flux2_rl_embeddings.sh (Qwen3, 512 tokens, with the empty prompt).
# Overridable: NPROC (16), MASTER_PORT (19003), EXTRA_ARGS, and flux2_klein_grpo_args.sh's KLEIN (base |
# distilled), MODEL_PATH, DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR, ROLLOUT_BATCH_SIZE.
# Trained weights: the args file's --trainable_modules and --master_weight_type (every weight, fp32 masters;
# why, and Flow-Factory's choices, there).
ARGS_FILE=scripts/finetune/flux2_klein_grpo_args.sh PROMPTS_PER_RANK=3 ACCUMULATION=6 NPROC_DEFAULT=16
source "$(dirname "${BASH_SOURCE[0]}")/current_line_grpo.sh"
