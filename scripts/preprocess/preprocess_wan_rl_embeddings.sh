#!/usr/bin/env bash
# Encode the RL prompts with Wan's umT5 text encoder (its last hidden state, zero past each prompt's
# tokens, as WanPipeline's encode_prompt; and the negative prompt "", WanPipeline's default, encoded
# once per batch and stored beside every prompt) into data/rl_embeddings_wan, the input of Wan training runs.
#
#   bash scripts/preprocess/preprocess_wan_rl_embeddings.sh [extra flags for preprocess_flux_embedding.py]
#
# The FLUX preprocessing launcher with --model_family wan on the current library line (LINE=current)
# and Wan defaults: MODEL_PATH data/wan, OUTPUT_DIR data/rl_embeddings_wan, MAX_SEQ_LEN 512
# (WanPipeline's max_sequence_length). Every other variable: preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" wan "$@"
