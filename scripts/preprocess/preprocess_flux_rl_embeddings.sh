#!/usr/bin/env bash
# Encode the RL prompts with FLUX's text encoders into data/rl_embeddings (the training input).
#
#   bash scripts/preprocess/preprocess_flux_rl_embeddings.sh [extra flags for preprocess_embeddings.py]
#
# Environment (all optional):
#   NPROC        processes (one per device); default: every visible NPU/GPU, 2 on CPU.
#                NPU_NUM / GPU_NUM are read too (the names upstream's scripts use).
#   MODEL_PATH   diffusers FLUX folder              (default data/flux)
#   PROMPT_FILE  prompts, one per line              (default assets/prompts.txt)
#   OUTPUT_DIR   where the embeddings go            (default data/rl_embeddings)
#   MAX_SEQ_LEN  T5 tokens per prompt               (default 512)
#   MAX_PROMPTS  keep the first N prompts           (default 50000)
#   BATCH_SIZE   prompts per encoder call per rank  (default 8)
#   NUM_WORKERS  DataLoader workers per rank        (default 1)
#   MASTER_PORT  rendezvous port; unset: torchrun --standalone picks a free one
#   DRY_RUN=1    print the command instead of running it
#   FASTVIDEO_DEVICE, PYTHON, NPU_ENV_FILE: see scripts/common.sh
# Rerunning resumes: prompts already encoded are skipped.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=../common.sh
source scripts/common.sh

MODEL_PATH=${MODEL_PATH:-data/flux}
if [ -z "${PROMPT_FILE:-}" ]; then
  # Said, not silent: a run meant for its own prompts would otherwise train on the bundled ones.
  echo "preprocess: PROMPT_FILE not set: encoding the bundled assets/prompts.txt ($(grep -c . assets/prompts.txt) prompts)" >&2
fi
PROMPT_FILE=${PROMPT_FILE:-assets/prompts.txt}
OUTPUT_DIR=${OUTPUT_DIR:-data/rl_embeddings}
MAX_SEQ_LEN=${MAX_SEQ_LEN:-512}
MAX_PROMPTS=${MAX_PROMPTS:-50000}
BATCH_SIZE=${BATCH_SIZE:-8}
NUM_WORKERS=${NUM_WORKERS:-1}

NPROC=${NPROC:-${NPU_NUM:-${GPU_NUM:-}}}
if [ -z "$NPROC" ]; then
  if [ "$FASTVIDEO_DEVICE" = "cpu" ]; then
    NPROC=2  # shows the sharding on any machine; each process runs single-threaded
  else
    NPROC=$("$PYTHON" -c "
import torch
from fastvideo.devices import import_torch_npu
import_torch_npu()
print(getattr(torch, '$FASTVIDEO_DEVICE').device_count())")
  fi
fi
if ! [[ "$NPROC" =~ ^[1-9][0-9]*$ ]]; then
  echo "NPROC must be a positive integer, got '$NPROC' (no $FASTVIDEO_DEVICE device visible?)" >&2
  exit 2
fi

if [ -n "${MASTER_PORT:-}" ]; then
  RDZV=(--nnodes=1 --master_addr=127.0.0.1 --master_port="$MASTER_PORT")
else
  RDZV=(--standalone)
fi

CMD=("${TORCHRUN[@]}" "${RDZV[@]}" --nproc_per_node="$NPROC"
  fastvideo/data_preprocess/preprocess_embeddings.py
  --model_path "$MODEL_PATH"
  --prompt_dir "$PROMPT_FILE"
  --output_dir "$OUTPUT_DIR"
  --max_sequence_length "$MAX_SEQ_LEN"
  --max_prompts "$MAX_PROMPTS"
  --batch_size "$BATCH_SIZE"
  --dataloader_num_workers "$NUM_WORKERS"
  "$@")

if [ "${DRY_RUN:-0}" = "1" ]; then
  echo "FASTVIDEO_DEVICE=$FASTVIDEO_DEVICE $(printf '%q ' "${CMD[@]}")"
  exit 0
fi
echo "preprocess: $NPROC x $FASTVIDEO_DEVICE, $PROMPT_FILE -> $OUTPUT_DIR (model $MODEL_PATH)"
exec "${CMD[@]}"
