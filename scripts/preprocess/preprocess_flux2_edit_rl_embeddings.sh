#!/usr/bin/env bash
# Encode an editing prompt file for FLUX.2 [klein] editing: each record's instruction with klein's Qwen3
# encoder (and the empty prompt, for classifier-free guidance), and its source image with the VAE (the
# patched, batch-norm-normalised tokens Flux2KleinPipeline(image=...) feeds the transformer, and the
# pixels the rewards compare with), into data/rl_embeddings_flux2_edit, the input of
# finetune_flux2_klein_grpo_*.sh. The prompt file is JSONL: {"prompt": ..., "image": path} per line,
# paths relative to the file (docs/editing.md); every image one size, sides multiples of 16 (Flow-Factory's
# klein: sources of 384 x 384 pixels of area). Several references (Flux2KleinPipeline(image=[...])): "image"
# a list of paths, every record as many (at most 4); the rewards and grids use the first reference.
#
#   PROMPT_FILE=data/edit/train.jsonl bash scripts/preprocess/preprocess_flux2_edit_rl_embeddings.sh
#
# The FLUX preprocessing launcher with --model_family flux2_edit on the current library line and its
# defaults: MODEL_PATH data/flux2 (the klein checkpoint: it edits and generates), OUTPUT_DIR
# data/rl_embeddings_flux2_edit, PROMPT_FILE assets/edit/prompts_edit.jsonl (the tiny bundled set). Every
# other variable: preprocess_flux_rl_embeddings.sh.
# The defaults are the family's line of fastvideo/models/catalog.py (preprocess_family_rl_embeddings.sh).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/preprocess_family_rl_embeddings.sh" flux2_edit "$@"
