#!/usr/bin/env bash
# Encode the RL prompts with FLUX.2 [dev]'s Mistral-3 text encoder (Mistral-Small-3.1-24B: the hidden states of
# layers 10, 20 and 30 under its chat template with Flux2Pipeline's system message) into
# data/rl_embeddings_flux2_dev, the input of finetune_flux2_dev_grpo_*.sh.
#
#   bash scripts/preprocess/preprocess_flux2_dev_rl_embeddings.sh [extra flags for preprocess_flux_embedding.py]
#
# The FLUX preprocessing launcher with --model_family flux2 on the current library line (LINE=current:
# .venv-current) and FLUX.2 [dev] defaults: MODEL_PATH data/flux2_dev, OUTPUT_DIR data/rl_embeddings_flux2_dev,
# MAX_SEQ_LEN 512 (Flux2Pipeline's max_sequence_length; the system message alone takes about 100 of them).
# The text encoder is 48 GB of bf16: it fits one 64 GB die or 80 GB GPU and leaves the device before training.
# Every other variable: preprocess_flux_rl_embeddings.sh.
set -euo pipefail
export MODEL_PATH=${MODEL_PATH:-data/flux2_dev}
export OUTPUT_DIR=${OUTPUT_DIR:-data/rl_embeddings_flux2_dev}
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" flux2 "$@"
