#!/usr/bin/env bash
# Encode the RL prompts with SD3.5's three text encoders (CLIP-L, CLIP-G, T5; and the empty prompt
# for classifier-free guidance) into data/rl_embeddings_sd3, the input of finetune_sd3_grpo_*.sh.
#
#   bash scripts/preprocess/preprocess_sd3_rl_embeddings.sh [extra flags for preprocess_embeddings.py]
#
# The FLUX preprocessing launcher with --model_family sd3 and SD3 defaults: MODEL_PATH data/sd3,
# OUTPUT_DIR data/rl_embeddings_sd3, MAX_SEQ_LEN 128 (Flow-GRPO's train_sd3.py encodes with
# max_sequence_length=128). Flow-GRPO's PickScore prompts are its dataset/pickscore/train.txt: pass
# PROMPT_FILE=... (default assets/prompts.txt). Every other variable: preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" sd3 "$@"
