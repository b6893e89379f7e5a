# Flow-Factory's GRPO configuration for FLUX.1 Kontext [dev] (github.com/X-GenGroup/Flow-Factory at
# 6c7882b: examples/grpo/full/flux1_kontext/default.yaml), as this trainer's flags. Sourced through
# scripts/finetune/current_line_grpo.sh by finetune_kontext_grpo_8gpus.sh and
# finetune_kontext_grpo_a3_16die.sh, which set PROMPTS_PER_RANK and ACCUMULATION for their world size.
# Overridable: MODEL_PATH (data/kontext: black-forest-labs/FLUX.1-Kontext-dev), DATA_JSON, OUTPUT_DIR,
# PICKSCORE_DIR, CLIP_DIR, ROLLOUT_BATCH_SIZE (8), REWARDS.
# Also overridable: TRAINABLE_MODULES (all) and MASTER_WEIGHT_TYPE (fp32), the peer's choices below.
# Each value's source (FF = Flow-Factory's yaml):
#   --h/--w 384               FF train.resolution: 384 (and condition_image_size 384: preprocess the source
#                             images at 384 x 384, docs/editing.md)
#   --sampling_steps 10       FF train.num_inference_steps: 10
#   --guidance_scale 2.5      FF train.guidance_scale: 2.5 (FluxKontextPipeline's default; the guidance embedding)
#   --flow_grpo_sampling      FF scheduler.dynamics_type: "Flow-SDE"
#   --eta 0.9                 FF scheduler.noise_level: 0.9
#   --sde_steps 1 --sde_start random --sde_window_range 1,4
#                             FF scheduler.num_sde_steps: 1, sde_steps: [1, 2, 3]
#   --pipeline_shift --no_quantize_timestep
#                             FluxKontextPipeline's dynamic shift for 384 x 384 and its unrounded timestep
#   --num_generations 16      FF train.group_size: 16
#   --use_group --adv_std population
#                             FF advantage_aggregation "gdpo" with one reward
#   --clip_range 1e-4         FF train.clip_range: 1.0e-4
#   --adv_clip_max 5          FF train.adv_clip_range: 5.0
#   --learning_rate 1e-5      FF optimizers[0].learning_rate: 1.0e-5 (finetune_type full)
#   --weight_decay 1e-4       FF optimizers[0].weight_decay: 1.0e-4
#   --max_grad_norm 1.0       FF optimizers[0].max_grad_norm: 1.0
#   --rewards pickscore:1.0   FF rewards: PickScore (REWARDS=clip_edit:1.0 scores against the source too)
#   --seed 42                 FF train.seed: 42
#   --checkpointing_steps 20  FF log.save_freq: 20
#   --mixed_precision bf16    FF mixed_precision: "bf16"
#   --trainable_modules all   FF model.target_modules: "default" (examples/grpo/full/flux1_kontext/default.yaml
#                             at a0b2bc5): Flow-Factory trains its family's default modules only (45%
#                             of the transformer, fastvideo/training/trainable.py); here every weight
#                             (the default, as before); TRAINABLE_MODULES=peer trains the peer's set
#   --master_weight_type fp32 FF model.master_weight_dtype: bfloat16 by default (src/flow_factory/hparams/model_args.py at a0b2bc5):
#                             the trainable weights and AdamW's state in bf16, trained in place;
#                             here fp32 masters (the default): an AdamW update below half a bf16 spacing of
#                             its weight (2^-9 relative) rounds away in bf16, so the peer's steps at lr 1e-5
#                             move the policy less than they say; MASTER_WEIGHT_TYPE=bf16 runs the peer's mode
#   kl: none                  FF train.kl_beta: 0
#   batch                     FF unique_sample_num_per_epoch 48 x group 16, gradient_step_per_epoch 2
# Chosen here (no source): --max_train_steps 300, --rollout_batch_size 8 and --train_micro_batch_size 4
# (memory only), --gradient_checkpointing (FF: off), --allow_tf32.
# Not reproduced: FF's EMA (decay 0.9 every 4 epochs) and its evaluation at 512 px.
GRPO_ARGS=(
  --model_family kontext
  --h 384 --w 384 --t 1 --num_latent_t 1
  --sampling_steps 10 --guidance_scale 2.5
  --eta 0.9 --flow_grpo_sampling --sde_steps 1 --sde_start random --sde_window_range 1,4
  --pipeline_shift --no_quantize_timestep
  --num_generations 16 --use_group --adv_std population
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0 --weight_decay 0.0001
  --learning_rate 1e-5 --lr_warmup_steps 0
  --trainable_modules "${TRAINABLE_MODULES:-all}" --master_weight_type "${MASTER_WEIGHT_TYPE:-fp32}"
  --rewards "${REWARDS:-pickscore:1.0}"
  --checkpointing_steps 20 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/kontext}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_kontext/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/kontext_grpo}"
  --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}"
  --clip_dir "${CLIP_DIR:-data/clip}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 4 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-8}"
  --max_train_steps 300 --dataloader_num_workers 4
)
