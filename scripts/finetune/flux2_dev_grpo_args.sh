# Flow-Factory's GRPO configuration for FLUX.2 [dev] (github.com/X-GenGroup/Flow-Factory at 5f6cda1:
# examples/grpo/full/flux2/t2i.yaml, model_name_or_path black-forest-labs/FLUX.2-dev, finetune_type
# full), as this trainer's flags, and the launch settings both launchers share. Sourced by
# finetune_flux2_dev_grpo_8gpus.sh and finetune_flux2_dev_grpo_a3_16die.sh, which set PROMPTS_PER_RANK,
# ACCUMULATION and OFFLOAD_DEFAULT for their world size and device (scripts/finetune/current_line_grpo.sh
# runs it). Overridable: MODEL_PATH (data/flux2_dev: FLUX.2-dev), DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR,
# CLIP_DIR, REWARDS, ROLLOUT_BATCH_SIZE (8), OFFLOAD (1: --use_cpu_offload; the launcher's default).
# Also overridable: TRAINABLE_MODULES (all) and MASTER_WEIGHT_TYPE (fp32), the peer's choices below.
# Each value's source (FF = Flow-Factory's yaml):
#   --h/--w 512               FF train.resolution: 512
#   --sampling_steps 10       FF train.num_inference_steps: 10
#   --guidance_scale 4.0      FF train.guidance_scale: 4 (dev is guidance-distilled: the value goes into the
#                             transformer's guidance embedding, one pass per step, as Flux2Pipeline's default 4.0)
#   --flow_grpo_sampling      FF scheduler.dynamics_type: "Flow-SDE" (Flow-GRPO's SDE)
#   --eta 1.0                 FF scheduler.noise_level: 1.0
#   --sde_steps 1 --sde_start random --sde_window_range 1,4
#                             FF scheduler.num_sde_steps: 1, sde_steps: [1, 2, 3]: one SDE (and trained) step per
#                             rollout, drawn from transitions 1-3; ODE elsewhere
#   --pipeline_shift --no_quantize_timestep
#                             Flux2Pipeline's schedule: mu = compute_empirical_mu(image tokens, steps), timestep / 1000
#   --num_generations 16      FF train.group_size: 16
#   --rewards clip:1.0,pickscore:0.5 --reward_mix advantage_aggr --use_group --adv_std population
#                             FF rewards: CLIP weight 1.0 and PickScore 0.5 with advantage_aggregation "gdpo":
#                             each reward's group advantages (r - mean) / np.std, weighted (its batch
#                             re-normalisation of the sum afterwards is not reproduced)
#   --clip_range 1e-4         FF train.clip_range: 1.0e-4
#   --adv_clip_max 5          FF train.adv_clip_range: 5.0
#   --learning_rate 1e-5      FF optimizers[0].learning_rate: 1.0e-5
#   --weight_decay 1e-4       FF optimizers[0].weight_decay: 1.0e-4 (betas 0.9 / 0.999, eps 1e-8: this trainer's defaults)
#   --max_grad_norm 1.0       FF optimizers[0].max_grad_norm: 1.0
#   --gradient_checkpointing  FF train.enable_gradient_checkpointing: true
#   --train_micro_batch_size 1  FF train.per_device_batch_size: 1
#   --seed 42                 FF train.seed: 42
#   --checkpointing_steps 20  FF log.save_freq: 20
#   --mixed_precision bf16    FF mixed_precision: "bf16"
#   --trainable_modules all   FF model.target_modules [attn.to_q, attn.to_k, attn.to_v, attn.to_out.0]
#                             (examples/grpo/full/flux2/t2i.yaml at a0b2bc5): Flow-Factory trains those projections only; here
#                             every weight (the default, as before); the peer's set:
#                             TRAINABLE_MODULES=attn.to_q,attn.to_k,attn.to_v,attn.to_out.0
#   --master_weight_type fp32 FF model.master_weight_dtype: bfloat16 by default (src/flow_factory/hparams/model_args.py at a0b2bc5):
#                             the trainable weights and AdamW's state in bf16, trained in place;
#                             here fp32 masters (the default): an AdamW update below half a bf16 spacing of
#                             its weight (2^-9 relative) rounds away in bf16, so the peer's steps at lr 1e-5
#                             move the policy less than they say; MASTER_WEIGHT_TYPE=bf16 runs the peer's mode
#   kl: none                  FF train.kl_beta: 0
#   batch                     FF unique_sample_num_per_epoch 48 prompts x group 16 per epoch and
#                             gradient_step_per_epoch 2: 48 / world size prompts per rank (PROMPTS_PER_RANK),
#                             micro-batches of 1 accumulated so that each iteration makes 2 optimizer steps
# Chosen here (no source): --max_train_steps 300 (FF gives no epoch count; the klein launchers' length),
# --rollout_batch_size 8 (memory; trajectories do not depend on it), --use_cpu_offload where the memory
# verdicts of docs/flux2.md need it (OFFLOAD), --allow_tf32.
# Not reproduced: FF's target_modules for this full fine-tuning (attn.to_q/k/v/to_out.0 only: this trainer's
# full fine-tuning trains every weight), its EMA (evaluation only) and its evaluation at 1024 px / 28 steps.
# The embeddings: bash scripts/preprocess/preprocess_flux2_dev_rl_embeddings.sh (Mistral-3, 512 tokens).
case "${OFFLOAD:-$OFFLOAD_DEFAULT}" in
  1) OFFLOAD_ARGS=(--use_cpu_offload) ;;
  0) OFFLOAD_ARGS=() ;;
  *) echo "OFFLOAD=${OFFLOAD}: use 1 (FSDP's shards on the host: 80 GB GPUs, 64 GB dies) or 0 (141 GB GPUs)" >&2
     exit 2 ;;
esac
GRPO_ARGS=(
  --model_family flux2
  --h 512 --w 512 --t 1 --num_latent_t 1
  --sampling_steps 10 --guidance_scale 4.0 --eta 1.0
  --flow_grpo_sampling --sde_steps 1 --sde_start random --sde_window_range 1,4
  --pipeline_shift --no_quantize_timestep
  --num_generations 16 --use_group --adv_std population
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0 --weight_decay 0.0001
  --learning_rate 1e-5 --lr_warmup_steps 0
  --trainable_modules "${TRAINABLE_MODULES:-all}" --master_weight_type "${MASTER_WEIGHT_TYPE:-fp32}"
  --rewards "${REWARDS:-clip:1.0,pickscore:0.5}" --reward_mix advantage_aggr
  --checkpointing_steps 20 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  "${OFFLOAD_ARGS[@]}"
  --pretrained_model_name_or_path "${MODEL_PATH:-data/flux2_dev}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_flux2_dev/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/flux2_dev_grpo}"
  --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}" --clip_dir "${CLIP_DIR:-data/clip}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 1 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-8}"
  --max_train_steps 300 --dataloader_num_workers 4
)
