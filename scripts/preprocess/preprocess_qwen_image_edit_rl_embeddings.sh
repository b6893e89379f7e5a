#!/usr/bin/env bash
# Encode an editing prompt file for Qwen-Image-Edit-2509 / -2511: each record's instruction with its source
# image through Qwen2.5-VL (the condition image at about 384^2 in the VL encoder, the negative " " with the
# same image), and the source image's VAE latents, into data/rl_embeddings_qwen_image_edit, the input of
# finetune_qwen_image_edit_grpo_*.sh. The prompt file is JSONL: {"prompt": ..., "image": path} per line,
# paths relative to the file (docs/editing.md); every image one size.
#
#   PROMPT_FILE=data/edit/train.jsonl bash scripts/preprocess/preprocess_qwen_image_edit_rl_embeddings.sh
#
# --source_vae_size ${SOURCE_VAE_SIZE:-384}: the area the source is resized to before the VAE, Flow-Factory's
# train.condition_image_size [384, 384] (github.com/X-GenGroup/Flow-Factory at a0b2bc5,
# examples/grpo/full/qwen_image_edit_plus/default.yaml; the stock pipeline's is 1024: SOURCE_VAE_SIZE=1024).
# 384^2 makes 576 source tokens per sample (24x24), beside the 576 generated ones at 384^2.
# The FLUX preprocessing launcher with --model_family qwen_image_edit on the current library line and these
# defaults: MODEL_PATH data/qwen_image_edit, OUTPUT_DIR data/rl_embeddings_qwen_image_edit, PROMPT_FILE
# assets/edit/prompts_edit.jsonl (the tiny bundled set), MAX_SEQ_LEN 512 (the instruction with its image's
# tokens). Every other variable: preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" qwen_image_edit "$@"
