#!/usr/bin/env bash
# Encode an editing prompt file for FLUX.1 Kontext [dev]: each record's instruction with FLUX.1's CLIP
# and T5 encoders, and its source image with the VAE (the packed latents FluxKontextPipeline feeds the
# transformer, and the pixels the rewards compare with), into data/rl_embeddings_kontext, the input of
# finetune_kontext_grpo_*.sh. The prompt file is JSONL: {"prompt": ..., "image": path} per line, paths
# relative to the file (docs/editing.md); every image one size, sides multiples of 16.
#
#   PROMPT_FILE=data/edit/train.jsonl bash scripts/preprocess/preprocess_kontext_rl_embeddings.sh
#
# The FLUX preprocessing launcher with --model_family kontext on the current library line and Kontext
# defaults: MODEL_PATH data/kontext, OUTPUT_DIR data/rl_embeddings_kontext, PROMPT_FILE
# assets/edit/prompts_edit.jsonl (the tiny bundled set). Every other variable:
# preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" kontext "$@"
