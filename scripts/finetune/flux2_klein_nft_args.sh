# Flow-Factory's NFT configuration for FLUX.2 [klein] base (github.com/X-GenGroup/Flow-Factory at a0b2bc5:
# examples/nft/full/flux2_klein_base/default.yaml, black-forest-labs/FLUX.2-klein-base-4B, full fine-tuning), as
# this trainer's --algorithm nft flags (docs/nft.md). Sourced through scripts/finetune/current_line_grpo.sh (it
# runs GRPO_ARGS, whatever the objective) by finetune_flux2_klein_nft_8gpus.sh and
# finetune_flux2_klein_nft_a3_16die.sh, which set PROMPTS_PER_RANK and ACCUMULATION for their world size.
# Overridable: MODEL_PATH (data/flux2: a FLUX.2 [klein] base folder), DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR,
# ROLLOUT_BATCH_SIZE (8), REWARDS, TRAINABLE_MODULES (all), MASTER_WEIGHT_TYPE (fp32).
# Each value's source (FF = that yaml):
#   --algorithm nft           FF train.trainer_type: 'nft'
#   --h/--w 384               FF train.resolution: 384
#   --sampling_steps 8 --guidance_scale 4.0
#                             FF train.num_inference_steps: 8, guidance_scale: 4.0 (the base model's CFG)
#   --nft_solver ode          FF scheduler.dynamics_type: "ODE" (Euler rollouts)
#   --pipeline_shift --no_quantize_timestep
#                             Flux2KleinPipeline's grid (its empirical mu), as scripts/finetune/flux2_klein_grpo_args.sh
#   --nft_beta 0.1            FF train.nft_beta: 0.1
#   --nft_decay_type 1        FF train.off_policy: true (rollouts from the EMA of the policy: this trainer's old
#                             policy), ema_decay_schedule piecewise_linear, flat_steps 0, ramp_rate 0.001,
#                             ema_decay 0.5, ema_update_interval 1: min(0.001 step, 0.5), the reference's type 1
#   --timestep_fraction 0.25  FF train.num_train_timesteps: 2 (2 of the 8 steps). FF draws them in scheduler time
#                             [500, 1000] (timestep_range 0.5, time_sampling_strategy discrete, time_shift 3;
#                             src/flow_factory/utils/noise_schedule.py); here 2 of the rollout's own 8 timesteps,
#                             a seeded permutation per sample: not reproduced
#   kl: none                  FF train.kl_beta: 0
#   --num_generations 16 --use_group --adv_std population
#                             FF train.group_size: 16, advantage_aggregation "gdpo", global_std false
#   --adv_clip_max 5          FF train.adv_clip_range: 5.0
#   --learning_rate 1e-5      FF train.learning_rate: 1.0e-5
#   --weight_decay 1e-4       FF train.adam_weight_decay: 1.0e-4 (betas 0.9 / 0.999, eps 1e-8: AdamW defaults here)
#   --max_grad_norm 1.0       FF train.max_grad_norm: 1.0
#   --trainable_modules all   FF model.target_modules: "default" (75% of klein, fastvideo/training/trainable.py);
#                             here every weight; TRAINABLE_MODULES=peer trains the peer's set
#   --master_weight_type fp32 FF model.master_weight_dtype: bfloat16 by default (src/flow_factory/hparams/
#                             model_args.py), trained in place; here fp32 masters (an AdamW update below half a
#                             bf16 spacing of its weight rounds away in bf16); MASTER_WEIGHT_TYPE=bf16 runs the peer's
#   --rewards pickscore:1.0   FF rewards: PickScore (weight 1)
#   --seed 42 --checkpointing_steps 20 --mixed_precision bf16
#                             FF train.seed 42, log.save_freq 20, mixed_precision "bf16"
#   batch                     FF unique_sample_num_per_epoch 48 x group 16, gradient_step_per_epoch 1: 48 / world
#                             size prompts per rank (PROMPTS_PER_RANK), micro-batches of 4 accumulated over all of
#                             a rank's samples (ACCUMULATION): one optimizer step per iteration
# The task (KLEIN_TASK): edit, the default, as FF's yaml (data.dataset_dir sharegpt4o_image_mini: instructions
# with source images, condition_image_size 384): --model_family flux2_edit (docs/editing.md); t2i: prompts alone
# (--model_family flux2). Not reproduced: FF's evaluation (1024 px condition, 28 steps).
# Chosen here (no source): --max_train_steps 300, --rollout_batch_size 8, --gradient_checkpointing (FF: off),
# --allow_tf32.
# The embeddings: edit: PROMPT_FILE=your.jsonl bash scripts/preprocess/preprocess_flux2_edit_rl_embeddings.sh;
# t2i: bash scripts/preprocess/preprocess_flux2_rl_embeddings.sh (Qwen3, 512 tokens, with the empty prompt).
case "${KLEIN_TASK:-edit}" in
  edit) TASK_ARGS=(--model_family flux2_edit); TASK_DATA=data/rl_embeddings_flux2_edit ;;
  t2i) TASK_ARGS=(--model_family flux2); TASK_DATA=data/rl_embeddings_flux2 ;;
  *) echo "KLEIN_TASK=${KLEIN_TASK}: use edit (instructions with source images, Flow-Factory's klein task) or t2i" >&2
     exit 2 ;;
esac
GRPO_ARGS=(
  --algorithm nft
  "${TASK_ARGS[@]}"
  --h 384 --w 384 --t 1 --num_latent_t 1
  --sampling_steps 8 --guidance_scale 4.0 --nft_solver ode
  --pipeline_shift --no_quantize_timestep
  --nft_beta 0.1 --nft_decay_type 1 --adv_mode all --timestep_fraction 0.25
  --num_generations 16 --use_group --adv_std population --adv_clip_max 5.0
  --max_grad_norm 1.0 --weight_decay 0.0001 --learning_rate 1e-5 --lr_warmup_steps 0
  --trainable_modules "${TRAINABLE_MODULES:-all}" --master_weight_type "${MASTER_WEIGHT_TYPE:-fp32}"
  --rewards "${REWARDS:-pickscore:1.0}"
  --checkpointing_steps 20 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/flux2}"
  --data_json_path "${DATA_JSON:-$TASK_DATA/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/flux2_klein_nft}"
  --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 4 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-8}"
  --max_train_steps 300 --dataloader_num_workers 4
)
