#!/usr/bin/env bash
# The embedded default: a complete GRPO run on a laptop CPU in a few minutes.
# Builds the tiny FLUX model, preprocesses the bundled prompts, and trains with the JPEG
# compressibility reward (no weights needed) on 2 CPU processes (gloo, FSDP full shard).
# Writes DEMO_DIR/outputs/{metrics.jsonl, reward_curve.png, images/, checkpoint-*} and the held-out
# evaluation: eval.jsonl, eval_grid.png, eval_curve.png, and best/ when an evaluation beats the base
# model's held-out reward without the reward-hacking guard (on detail, warn only) flagging it; a run
# with no such evaluation has no best/, and its closing lines say how many were flagged or below base.
# A second run starts afresh: --overwrite clears what the first one wrote in DEMO_DIR/outputs
# (checkpoints, metrics, images, evaluation files; nothing else). To continue a run instead:
#   EXTRA_ARGS="--resume_from_checkpoint latest" STEPS=60 bash scripts/demo/grpo_tiny_cpu.sh
# Overridable: DEMO_DIR (data/demo), NPROC (2), STEPS (iterations), EXTRA_ARGS, DRY_RUN=1,
# MODEL (flux, or any family of fastvideo/models/catalog.py, one line a family holding its demo settings:
# sd3, flux2, zimage, qwen_image, kontext, qwen_image_edit; `python -m fastvideo.models.catalog names`.
# Each family's model, embeddings and outputs go to DEMO_DIR/{tiny_NAME, embeddings_NAME, outputs_NAME}
# (with LINE=current on flux or sd3: each of them suffixed _current, so the lines never share a folder);
# flux2, zimage, qwen_image and the editing families run on the current library line (LINE=current, the
# default for them). zimage reads its lr from ZIMAGE_LR (1e-2), qwen_image and qwen_image_edit from
# QWEN_IMAGE_LR (1e-2); kontext and qwen_image_edit edit the bundled source images of assets/edit/ with
# the clip_edit reward of tiny CLIP weights built into DEMO_DIR/tiny_rewards, evaluated on
# assets/edit/eval_edit.jsonl (docs/editing.md), qwen_image_edit's sources at a 64^2 VAE area
# (SOURCE_VAE_SIZE, 16 tokens)),
# ALGO (grpo, or nft: DiffusionNFT with DPM-Solver++ rollouts, one optimizer step per prompt group
# at lr 1e-2 as in docs/nft.md's race; outputs in DEMO_DIR/outputs_nft),
# OUTPUT_DIR (where the run writes; the LoRA demo in README uses DEMO_DIR/outputs_lora),
# LINE (recipe or current: the library line, README "Library lines").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DEMO_DIR=${DEMO_DIR:-data/demo}
# The family's wiring, its line of fastvideo/models/catalog.py (standard library only: asked before
# env_setup.sh installs anything): TINY, BUILD, EMB, OUT, PREPROCESS, SEQ, FAMILY_ARGS, DEMO_LINE,
# STAMP and, for an editing family, PROMPTS. An unknown MODEL: one line naming the choices, exit 2.
WIRING=$("${PYTHON:-python3}" -m fastvideo.models.catalog demo "${MODEL:-flux}" --demo_dir "$DEMO_DIR")
eval "$WIRING"
if [ "$DEMO_LINE" = current ]; then
  export LINE=${LINE:-current}
  if [ "$LINE" != current ]; then
    echo "MODEL=$MODEL runs on the current library line (diffusers 0.42.1): drop LINE=$LINE or set LINE=current" >&2
    exit 2
  fi
fi
# Each library line its own folders: LINE=current on a family both lines run (flux, sd3)
# builds its tiny model with the other diffusers and its --overwrite would clear the recipe line's
# outputs, so it writes DEMO_DIR/{tiny_NAME, embeddings..., outputs...}_current.
if [ "$DEMO_LINE" != current ] && [ "${LINE:-recipe}" = current ]; then
  TINY="${TINY}_current"; EMB="${EMB}_current"; OUT="${OUT}_current"
fi
if [ "${DRY_RUN:-0}" != 1 ]; then bash env_setup.sh --target cpu; fi  # a dry run installs nothing
export FASTVIDEO_DEVICE=cpu
source scripts/common.sh
NPROC=${NPROC:-2}
STEPS=${STEPS:-40}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The objective: GRPO shares one noise per prompt group (--init_same_noise); NFT's deterministic
# DPM-Solver++ rollouts would make a group's samples equal, so it draws each sample's own noise.
case "${ALGO:-grpo}" in
  grpo) ALGO_ARGS=(--init_same_noise --learning_rate 3e-3) ;;
  nft) ALGO_ARGS=(--algorithm nft --nft_solver dpm --nft_beta 1.0 --nft_decay_type 1
                  --gradient_accumulation_steps 2 --learning_rate 1e-2); OUT="${OUT}_nft" ;;
  *) echo "ALGO=${ALGO}: use grpo or nft" >&2; exit 2 ;;
esac
OUTPUT_DIR=${OUTPUT_DIR:-$DEMO_DIR/$OUT}

# A tiny folder built by another version of the builders (a preset changed: the tiny SD3.5's VAE
# factors did) is rebuilt, else the demo would silently train the old model: the stamp (STAMP, from
# the catalog) is a hash of the builder modules, written after a complete build.
if [ "${DRY_RUN:-0}" != 1 ]; then
  if [ ! -f "$DEMO_DIR/$TINY/model_index.json" ] || [ "$(cat "$DEMO_DIR/$TINY/.demo_build" 2>/dev/null)" != "$STAMP" ]; then
    if [ -d "$DEMO_DIR/$TINY" ]; then echo "demo: rebuilding $DEMO_DIR/$TINY (built by another builder version)"; fi
    rm -rf "${DEMO_DIR:?}/$TINY"
    "$PYTHON" -m "${BUILD[@]}" "$DEMO_DIR/$TINY" --seed 0
    echo "$STAMP" > "$DEMO_DIR/$TINY/.demo_build"
  fi
  if [ -n "${PROMPTS:-}" ] && [ ! -d "$DEMO_DIR/tiny_rewards/pickscore" ]; then  # an editing demo
    "$PYTHON" -m fastvideo.tools.make_tiny_reward "$DEMO_DIR/tiny_rewards"  # clip_edit's CLIP weights
  fi
  MODEL_PATH="$DEMO_DIR/$TINY" PROMPT_FILE="${PROMPTS:-assets/prompts.txt}" OUTPUT_DIR="$DEMO_DIR/$EMB" \
    NPROC="$NPROC" MAX_SEQ_LEN=$SEQ MAX_PROMPTS=64 bash "scripts/preprocess/$PREPROCESS"
fi

# shellcheck disable=SC2086
fg_run --standalone --nnodes=1 --nproc_per_node="$NPROC" \
  fastvideo/train_grpo_flux.py \
  --seed 42 \
  --pretrained_model_name_or_path "$DEMO_DIR/$TINY" \
  --data_json_path "$DEMO_DIR/$EMB/videos2caption.json" \
  --output_dir "$OUTPUT_DIR" \
  --rewards compressibility:1.0 \
  --h 64 --w 64 \
  --sampling_steps 8 \
  --eta 0.7 \
  --shift 3 \
  --num_generations 8 \
  --train_batch_size 1 \
  --rollout_batch_size 8 \
  --train_micro_batch_size 4 \
  --gradient_accumulation_steps 1 \
  --timestep_fraction 1.0 \
  --use_group \
  --clip_range 0.2 \
  --adv_clip_max 5.0 \
  --weight_decay 0.0 \
  --max_grad_norm 1.0 \
  --mixed_precision no \
  --max_train_steps "$STEPS" \
  --checkpointing_steps 10 \
  --save_images_every 10 \
  --dataloader_num_workers 0 \
  --sampler_seed 1223627 \
  --eval_every 10 \
  --eval_prompts assets/eval_prompts.txt \
  --eval_rewards detail,saturation \
  --eval_batch_size 16 \
  --guard_reward detail \
  --guard_action warn \
  --overwrite \
  "${ALGO_ARGS[@]}" \
  ${FAMILY_ARGS[@]+"${FAMILY_ARGS[@]}"} \
  ${EXTRA_ARGS:-}

[ "${DRY_RUN:-0}" = 1 ] && exit 0
"$PYTHON" -m fastvideo.tools.demo_summary "$OUTPUT_DIR"
