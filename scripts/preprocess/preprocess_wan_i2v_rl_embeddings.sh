#!/usr/bin/env bash
# Encode the image-to-video prompts (a JSONL of {"prompt": ..., "image": ...}: each clip's first frame)
# for Wan2.1-I2V: umT5 at 512 tokens (the I2V transformer's text length) with the negative prompt "",
# and each first frame's VAE condition (its latents and the mask channels, for NUM_FRAMES-frame clips:
# the training's --num_frames) and CLIP features, as WanImageToVideoPipeline, into
# data/rl_embeddings_wan_i2v, the input of wan_i2v training runs.
#
#   NUM_FRAMES=81 bash scripts/preprocess/preprocess_wan_i2v_rl_embeddings.sh [extra flags]
#
# The FLUX preprocessing launcher with --model_family wan_i2v on the current library line and the
# defaults of the family's line of fastvideo/models/catalog.py: MODEL_PATH data/wan_i2v, OUTPUT_DIR
# data/rl_embeddings_wan_i2v, PROMPT_FILE assets/edit/prompts_edit.jsonl, MAX_SEQ_LEN 512, NUM_FRAMES 81.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" wan_i2v "$@"
