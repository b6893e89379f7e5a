#!/usr/bin/env bash
# Encode the RL prompts with HunyuanVideo's text encoders (Llama's hidden states two layers before the
# last on the prompt in HunyuanVideoPipeline's template, its first 95 tokens cropped, with the attention
# mask; CLIP's pooled output: HunyuanVideoPipeline.encode_prompt) into data/rl_embeddings_hunyuan_video,
# the input of HunyuanVideo training runs (upstream DanceGRPO's scripts/preprocess/
# preprocess_hunyuan_rl_embeddings.sh at 15cc71d, with the pooled vector stored beside the sequence).
#
#   bash scripts/preprocess/preprocess_hunyuan_video_rl_embeddings.sh [extra flags for preprocess_flux_embedding.py]
#
# The FLUX preprocessing launcher with --model_family hunyuan_video on either library line and HunyuanVideo
# defaults: MODEL_PATH data/hunyuan_video, OUTPUT_DIR data/rl_embeddings_hunyuan_video, MAX_SEQ_LEN 256
# (HunyuanVideoPipeline's max_sequence_length). Every other variable: preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" hunyuan_video "$@"
