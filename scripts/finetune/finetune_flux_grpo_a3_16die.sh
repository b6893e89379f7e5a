#!/usr/bin/env bash
# GRPO for FLUX.1-dev on one Atlas A3 node, 16 NPU dies (the Ascend recipe's reference run):
# train GBS 64 = 1 (micro-batch) x 4 (accumulation) x 16 (dies); about 310 s per iteration reported.
# The same script runs on a 16-GPU CUDA node. DRY_RUN=1 prints the torchrun command.
# CLIP_RANGE (1e-4) and POLICY_LOSS (clip; set by the GRPO-Guard launcher) are overridable too.
# Overridable: NPROC (16), MASTER_PORT (19002), MODEL_PATH (data/flux), DATA_JSON, OUTPUT_DIR, EXTRA_ARGS,
# REWARDS (the reward spec instead of --use_hpsv2, e.g. compressibility:1.0 for a CPU smoke test),
# TRAIN_SCRIPT (the LoRA launcher sets fastvideo/train_grpo_flux_lora.py).
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as DanceGRPO's full fine-tuning; EXTRA_ARGS may choose otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
MODEL_PATH=${MODEL_PATH:-data/flux}
fg_rewards --use_hpsv2
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="${NPROC:-16}" --master_port="${MASTER_PORT:-19002}" \
  "${TRAIN_SCRIPT:-fastvideo/train_grpo_flux.py}" \
  --seed 42 \
  --pretrained_model_name_or_path "$MODEL_PATH" \
  --vae_model_path "$MODEL_PATH" \
  --data_json_path "${DATA_JSON:-data/rl_embeddings/videos2caption.json}" \
  --gradient_checkpointing \
  --train_batch_size 1 \
  --num_latent_t 1 \
  --sp_size "${SP:-1}" \
  --dataloader_num_workers 4 \
  --gradient_accumulation_steps 4 \
  --max_train_steps 300 \
  --learning_rate 1e-5 \
  --mixed_precision bf16 \
  --checkpointing_steps 40 \
  --allow_tf32 \
  --cfg 0.0 \
  --output_dir "${OUTPUT_DIR:-data/outputs/grpo}" \
  --h 720 \
  --w 720 \
  --t 1 \
  --sampling_steps 16 \
  --eta 0.3 \
  --lr_warmup_steps 0 \
  --sampler_seed 1223627 \
  --max_grad_norm 1.0 \
  --weight_decay 0.0001 \
  "${REWARD_ARGS[@]}" \
  --num_generations 12 \
  --shift 3 \
  --use_group \
  --timestep_fraction 0.6 \
  --init_same_noise \
  --clip_range "${CLIP_RANGE:-1e-4}" ${POLICY_LOSS:+--policy_loss "$POLICY_LOSS"} \
  --adv_clip_max 5.0 \
  --rollout_batch_size 4 \
  --train_micro_batch_size 1 \
  "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
