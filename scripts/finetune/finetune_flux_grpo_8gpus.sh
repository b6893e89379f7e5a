#!/usr/bin/env bash
# GRPO for FLUX.1-dev on 8 devices (GPU or NPU, detected): upstream's 8-GPU configuration,
# train_batch_size 2, accumulation 12, EMA 0.995. DRY_RUN=1 prints the torchrun command.
# CLIP_RANGE (1e-4) and POLICY_LOSS (clip; set by the GRPO-Guard launcher) are overridable too.
# Overridable: NPROC (8), MASTER_PORT (19002), MODEL_PATH (data/flux), DATA_JSON, OUTPUT_DIR, REWARDS (the reward spec instead of --use_hpsv2),
# EXTRA_ARGS.
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as DanceGRPO's full fine-tuning; EXTRA_ARGS may choose otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
MODEL_PATH=${MODEL_PATH:-data/flux}
fg_rewards --use_hpsv2
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="${NPROC:-8}" --master_port="${MASTER_PORT:-19002}" \
  fastvideo/train_grpo_flux.py \
  --seed 42 \
  --pretrained_model_name_or_path "$MODEL_PATH" \
  --vae_model_path "$MODEL_PATH" \
  --data_json_path "${DATA_JSON:-data/rl_embeddings/videos2caption.json}" \
  --gradient_checkpointing \
  --train_batch_size 2 \
  --num_latent_t 1 \
  --sp_size "${SP:-1}" \
  --dataloader_num_workers 4 \
  --gradient_accumulation_steps 12 \
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
  --max_grad_norm 0.01 \
  --weight_decay 0.0001 \
  "${REWARD_ARGS[@]}" \
  --num_generations 12 \
  --shift 3 \
  --use_group \
  --timestep_fraction 0.6 \
  --init_same_noise \
  --clip_range "${CLIP_RANGE:-1e-4}" ${POLICY_LOSS:+--policy_loss "$POLICY_LOSS"} \
  --adv_clip_max 5.0 \
  --use_ema \
  --ema_decay 0.995 \
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-4}" \
  --train_micro_batch_size 1 \
  "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
