#!/usr/bin/env bash
# Encode the RL prompts with FLUX.2 [klein]'s Qwen3 text encoder (the hidden states of layers 9, 18
# and 27 under Qwen3's chat template, as Flux2KleinPipeline; and the empty prompt, for classifier-free
# guidance) into data/rl_embeddings_flux2, the input of finetune_flux2_klein_grpo_*.sh.
#
#   bash scripts/preprocess/preprocess_flux2_rl_embeddings.sh [extra flags for preprocess_flux_embedding.py]
#
# The FLUX preprocessing launcher with --model_family flux2 on the current library line (LINE=current:
# .venv-current) and FLUX.2 defaults: MODEL_PATH data/flux2, OUTPUT_DIR data/rl_embeddings_flux2,
# MAX_SEQ_LEN 512 (Flux2KleinPipeline's max_sequence_length; the transformer attends to the padding
# too, so another length is another model input). Every other variable: preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" flux2 "$@"
