#!/usr/bin/env bash
# Encode the RL prompts with Qwen-Image's Qwen2.5-VL text encoder (its last hidden layer under
# QwenImagePipeline's system template, the template's 34 prefix tokens dropped, each prompt's own
# tokens kept by a mask; and the negative prompt " ", for true classifier-free guidance) into
# data/rl_embeddings_qwen_image, the input of finetune_qwen_image_grpo_*.sh.
#
#   bash scripts/preprocess/preprocess_qwen_image_rl_embeddings.sh [extra flags for preprocess_flux_embedding.py]
#
# The FLUX preprocessing launcher with --model_family qwen_image on the current library line (LINE=current)
# and Qwen-Image defaults: MODEL_PATH data/qwen_image, OUTPUT_DIR data/rl_embeddings_qwen_image, MAX_SEQ_LEN
# 512 (QwenImagePipeline's max_sequence_length; a longer prompt is cut there, as in the pipeline). Every
# other variable: preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" qwen_image "$@"
