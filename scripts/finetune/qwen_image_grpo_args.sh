# Flow-Factory's GRPO configuration for Qwen-Image (github.com/X-GenGroup/Flow-Factory at 6c7882b:
# examples/grpo/full/qwen_image/default.yaml), as this trainer's flags. Sourced through
# scripts/finetune/current_line_grpo.sh by finetune_qwen_image_grpo_8gpus.sh and
# finetune_qwen_image_grpo_a3_16die.sh, which set PROMPTS_PER_RANK and ACCUMULATION for their world size.
# Overridable: MODEL_PATH (data/qwen_image), DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR, CLIP_DIR,
# ROLLOUT_BATCH_SIZE (8), REWARDS.
# Also overridable: TRAINABLE_MODULES (all) and MASTER_WEIGHT_TYPE (fp32), the peer's choices below.
# Each value's source (FF = that yaml):
#   --h/--w 384               FF train.resolution: 384
#   --sampling_steps 10       FF train.num_inference_steps: 10
#   --guidance_scale 4.0      FF train.guidance_scale: 4 ("Corresponds to `true_cfg_scale` in Qwen-Image-Pipeline",
#                             FF src/flow_factory/models/qwen_image/qwen_image.py at c4c078c): true CFG, on for > 1
#                             with a negative prompt; here always with " " (Qwen-Image's model card); FF encodes ""
#                             (qwen_image.py L171 at a0b2bc5): one token; tiny model: latents 1.2% apart (docs/qwen_image.md)
#   --flow_grpo_sampling      FF scheduler.dynamics_type: "Flow-SDE" (Flow-GRPO's SDE)
#   --eta 1.0                 FF scheduler.noise_level: 1.0
#   --sde_steps 1 --sde_start random --sde_window_range 1,4
#                             FF scheduler.num_sde_steps: 1, sde_steps: [1, 2, 3]: one SDE (and trained) step per
#                             rollout drawn from those transitions; ODE elsewhere
#   --pipeline_shift --no_quantize_timestep
#                             Qwen/Qwen-Image's scheduler_config.json: dynamic exponential shift, exp(mu) at the
#                             image's token count (1.676 at 384 px), as QwenImagePipeline; its timestep unrounded
#   --num_generations 16      FF train.group_size: 16
#   --use_group --adv_std population
#                             FF advantage_aggregation "gdpo", global_std false: each group's (r - mean) / np.std
#                             (its batch re-normalisation afterwards is not reproduced)
#   --clip_range 1e-4         FF train.clip_range: 1.0e-4
#   --adv_clip_max 5          FF train.adv_clip_range: 5.0
#   --learning_rate 1e-5      FF optimizers[0].learning_rate: 1.0e-5 (finetune_type full)
#   --weight_decay 1e-4       FF optimizers[0].weight_decay: 1.0e-4 (betas 0.9 / 0.999, eps 1e-8: AdamW defaults here)
#   --max_grad_norm 1.0       FF optimizers[0].max_grad_norm: 1.0
#   --rewards clip:1.0,pickscore:0.5 --reward_mix advantage_aggr
#                             FF rewards: CLIP (text_alignment) weight 1.0, PickScore weight 0.5, with
#                             advantage_aggregation "gdpo": each reward's group advantages, then the
#                             weights (summed raw, PickScore's larger spread gave >= 96% of the signal)
#   --seed 42                 FF train.seed: 42
#   --checkpointing_steps 20  FF log.save_freq: 20
#   --mixed_precision bf16    FF mixed_precision: "bf16"
#   --trainable_modules all   FF model.target_modules: "default" (examples/grpo/full/qwen_image/default.yaml
#                             at a0b2bc5): Flow-Factory trains its family's default modules only (44%
#                             of the transformer, fastvideo/training/trainable.py); here every weight
#                             (the default, as before); TRAINABLE_MODULES=peer trains the peer's set
#   --master_weight_type fp32 FF model.master_weight_dtype: bfloat16 by default (src/flow_factory/hparams/model_args.py at a0b2bc5):
#                             the trainable weights and AdamW's state in bf16, trained in place;
#                             here fp32 masters (the default): an AdamW update below half a bf16 spacing of
#                             its weight (2^-9 relative) rounds away in bf16, so the peer's steps at lr 1e-5
#                             move the policy less than they say; MASTER_WEIGHT_TYPE=bf16 runs the peer's mode
#   --gradient_checkpointing  FF train.enable_gradient_checkpointing: true
#   kl: none                  FF train.kl_beta: 0
#   batch                     FF unique_sample_num_per_epoch 48 x group 16 and gradient_step_per_epoch 2:
#                             48 / world size prompts per rank (PROMPTS_PER_RANK), micro-batches accumulated
#                             so that each iteration makes 2 optimizer steps (ACCUMULATION)
# Chosen here (no source): --max_train_steps 300 (FF gives no epoch count), --rollout_batch_size 8 and
# --train_micro_batch_size 2 (memory only: docs/qwen_image.md's verdicts), --allow_tf32.
# Not reproduced: FF's EMA (decay 0.9 every 4 epochs, evaluation only) and its evaluation at 1024 px. The
# scheduler's shift_terminal 0.02 stretch is reproduced: the trainer's grid is the shift stretched to it, as
# the stock scheduler's (docs/qwen_image.md).
# The embeddings: bash scripts/preprocess/preprocess_qwen_image_rl_embeddings.sh (Qwen2.5-VL, 512 tokens, with " ").
GRPO_ARGS=(
  --model_family qwen_image
  --h 384 --w 384 --t 1 --num_latent_t 1
  --sampling_steps 10 --guidance_scale 4.0
  --eta 1.0 --flow_grpo_sampling --sde_steps 1 --sde_start random --sde_window_range 1,4
  --pipeline_shift --no_quantize_timestep
  --num_generations 16 --use_group --adv_std population
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0 --weight_decay 0.0001
  --learning_rate 1e-5 --lr_warmup_steps 0
  --trainable_modules "${TRAINABLE_MODULES:-all}" --master_weight_type "${MASTER_WEIGHT_TYPE:-fp32}"
  --rewards "${REWARDS:-clip:1.0,pickscore:0.5}" --reward_mix advantage_aggr
  --checkpointing_steps 20 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/qwen_image}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_qwen_image/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/qwen_image_grpo}"
  --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}" --clip_dir "${CLIP_DIR:-data/clip}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 2 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-8}"
  --max_train_steps 300 --dataloader_num_workers 4
)
