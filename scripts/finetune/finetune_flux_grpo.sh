#!/usr/bin/env bash
# Multi-node GRPO for FLUX.1-dev. Run once per node with the same MASTER_ADDR/MASTER_PORT:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash scripts/finetune/finetune_flux_grpo.sh   # node 0
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 bash scripts/finetune/finetune_flux_grpo.sh   # node 1
# Device detected per node (NPU/HCCL or GPU/NCCL). HCCL_CONNECT_TIMEOUT (scripts/npu_env.sh) is
# 1200 s because link set-up across nodes is slow. DRY_RUN=1 prints the torchrun command.
# Overridable: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), MASTER_PORT (29500),
# NPROC_PER_NODE (8), MODEL_PATH, DATA_JSON, OUTPUT_DIR, REWARDS (the reward spec instead of --use_hpsv2),
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
fg_run --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --nproc_per_node="${NPROC_PER_NODE:-8}" \
  --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-29500}" \
  fastvideo/train_grpo_flux.py \
  --seed 42 \
  --pretrained_model_name_or_path "$MODEL_PATH" \
  --vae_model_path "$MODEL_PATH" \
  --data_json_path "${DATA_JSON:-data/rl_embeddings/videos2caption.json}" \
  --gradient_checkpointing \
  --train_batch_size 1 \
  --dataloader_num_workers 4 \
  --gradient_accumulation_steps 4 \
  --max_train_steps 300 \
  --learning_rate 1e-5 \
  --mixed_precision bf16 \
  --checkpointing_steps 40 \
  --allow_tf32 \
  --output_dir "${OUTPUT_DIR:-data/outputs/grpo}" \
  --h 720 \
  --w 720 \
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
  --clip_range 1e-4 \
  --adv_clip_max 5.0 \
  --fsdp_sharding_strategy "${FSDP_STRATEGY:-hybrid}" \
  --rollout_batch_size 4 \
  --train_micro_batch_size 1 \
  ${EXTRA_ARGS:-}
