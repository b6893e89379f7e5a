#!/usr/bin/env bash
# Encode the RL prompts with Z-Image's Qwen3 text encoder (its second-to-last hidden layer under the
# chat template, each prompt's own tokens kept by a mask, as ZImagePipeline; and the empty prompt,
# for classifier-free guidance) into data/rl_embeddings_zimage, the input of finetune_zimage_grpo_*.sh.
#
#   bash scripts/preprocess/preprocess_zimage_rl_embeddings.sh [extra flags for preprocess_flux_embedding.py]
#
# The FLUX preprocessing launcher with --model_family zimage on the current library line (LINE=current)
# and Z-Image defaults: MODEL_PATH data/zimage, OUTPUT_DIR data/rl_embeddings_zimage, MAX_SEQ_LEN 512
# (ZImagePipeline's max_sequence_length; a longer prompt is cut there, as in the pipeline). Every other
# variable: preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" zimage "$@"
