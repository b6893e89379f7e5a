# Flow-Factory's GRPO configuration for FLUX.2 [klein] (github.com/X-GenGroup/Flow-Factory at 5f6cda1:
# examples/grpo/full/flux2_klein_base/default.yaml for the base checkpoint, the default here, and
# examples/grpo/full/flux2_klein/default.yaml for the step-distilled one, KLEIN=distilled), as this
# trainer's flags, and the launch settings both launchers share. Sourced by
# finetune_flux2_klein_grpo_8gpus.sh and finetune_flux2_klein_grpo_a3_16die.sh, which set
# PROMPTS_PER_RANK and ACCUMULATION for their world size (scripts/finetune/current_line_grpo.sh runs it). Overridable: KLEIN (base | distilled), KLEIN_TASK (edit | t2i),
# MODEL_PATH (data/flux2: FLUX.2-klein-base-4B, or FLUX.2-klein-4B with KLEIN=distilled; the 9B
# checkpoints take the same flags), DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR, ROLLOUT_BATCH_SIZE (8).
# Also overridable: TRAINABLE_MODULES (all) and MASTER_WEIGHT_TYPE (fp32), the peer's choices below.
# Each value's source (FF = Flow-Factory's yaml; base / distilled where they differ):
#   --h/--w 384               FF train.resolution: 384 (both)
#   --sampling_steps 8 / 4    FF train.num_inference_steps: 8 / 4 ("Flux2-klein has already been distilled to 4 steps")
#   --guidance_scale 4.0 / 1  FF train.guidance_scale: 4.0 / 1.0 (true classifier-free guidance on the base;
#                             none on the distilled checkpoint, whose model_index.json is_distilled the family checks)
#   --flow_grpo_sampling      FF scheduler.dynamics_type: "Flow-SDE" (Flow-GRPO's SDE)
#   --eta 0.7 / 0.5           FF scheduler.noise_level: 0.7 / 0.5
#   --sde_steps 1 --sde_start random --sde_window_range 1,4 / 1,3
#                             FF scheduler.num_sde_steps: 1, sde_steps: [1, 2, 3] / [1, 2]: one SDE (and
#                             trained) step per rollout, drawn from those transitions; ODE elsewhere
#   --pipeline_shift --no_quantize_timestep
#                             FF's adapter sets the scheduler's timesteps with mu = compute_empirical_mu(image
#                             tokens, steps) and passes timestep / 1000 unrounded, as Flux2KleinPipeline
#   --num_generations 16      FF train.group_size: 16
#   --use_group --adv_std population
#                             FF advantage_aggregation "gdpo" with one reward: each group's (r - mean) / np.std
#                             (population std); its batch re-normalisation of the result afterwards is not
#                             reproduced (the group-normalised advantages already have mean 0, std ~1)
#   --clip_range 1e-4         FF train.clip_range: 1.0e-4
#   --adv_clip_max 5          FF train.adv_clip_range: 5.0
#   --learning_rate 1e-5      FF optimizers[0].learning_rate: 1.0e-5 (full fine-tuning, finetune_type full)
#   --weight_decay 1e-4       FF optimizers[0].weight_decay: 1.0e-4 (betas 0.9 / 0.999, eps 1e-8: this trainer's AdamW defaults)
#   --max_grad_norm 1.0       FF optimizers[0].max_grad_norm: 1.0
#   --rewards pickscore:1.0   FF rewards: PickScore, weight 1 (the distilled yaml trains on PickScore_Rank, a
#                             group-rank transform of PickScore this trainer does not have: PickScore itself)
#   --seed 42                 FF train.seed: 42
#   --checkpointing_steps 20  FF log.save_freq: 20
#   --mixed_precision bf16    FF mixed_precision: "bf16"
#   --trainable_modules all   FF model.target_modules: "default" (examples/grpo/full/flux2_klein/default.yaml
#                             at a0b2bc5): Flow-Factory trains its family's default modules only (75%
#                             of the transformer, fastvideo/training/trainable.py); here every weight
#                             (the default, as before); TRAINABLE_MODULES=peer trains the peer's set
#   --master_weight_type fp32 FF model.master_weight_dtype: bfloat16 by default (src/flow_factory/hparams/model_args.py at a0b2bc5):
#                             the trainable weights and AdamW's state in bf16, trained in place;
#                             here fp32 masters (the default): an AdamW update below half a bf16 spacing of
#                             its weight (2^-9 relative) rounds away in bf16, so the peer's steps at lr 1e-5
#                             move the policy less than they say; MASTER_WEIGHT_TYPE=bf16 runs the peer's mode
#   kl: none                  FF train.kl_beta: 0
#   batch                     FF unique_sample_num_per_epoch 48 prompts x group 16 per epoch and
#                             gradient_step_per_epoch 2: 48 / world size prompts per rank (PROMPTS_PER_RANK),
#                             micro-batches of 4 accumulated so that each iteration makes 2 optimizer steps
#                             (ACCUMULATION); FF spreads a group over GPUs, this trainer keeps it on one rank
# Chosen here (no source): --max_train_steps 300 (FF gives no epoch count in these yamls; SD3's launchers'
# length), --rollout_batch_size 8 and --train_micro_batch_size 4 (memory; trajectories and the summed
# gradient do not depend on them), --gradient_checkpointing (FF: off; the memory verdicts of docs/flux2.md
# are computed with it), --allow_tf32.
# Not reproduced: FF's EMA (decay 0.9 every 4 epochs, used for evaluation only) and its evaluation at 1024 px.
# The task (KLEIN_TASK): edit, the default, as FF's klein yamls (data.dataset_dir sharegpt4o_image_mini: an
# instruction and a source image per sample, FF train.condition_image_size 384): --model_family flux2_edit
# (Flux2KleinPipeline's image= path; give 384 x 384 sources, docs/editing.md); t2i: text-to-image on the
# same checkpoint (--model_family flux2).
# The embeddings: edit: PROMPT_FILE=your.jsonl bash scripts/preprocess/preprocess_flux2_edit_rl_embeddings.sh;
# t2i: bash scripts/preprocess/preprocess_flux2_rl_embeddings.sh (Qwen3, 512 tokens, with the empty prompt).
case "${KLEIN_TASK:-edit}" in
  edit) TASK_ARGS=(--model_family flux2_edit); TASK_DATA=data/rl_embeddings_flux2_edit ;;
  t2i) TASK_ARGS=(--model_family flux2); TASK_DATA=data/rl_embeddings_flux2 ;;
  *) echo "KLEIN_TASK=${KLEIN_TASK}: use edit (instructions with source images, Flow-Factory's klein task) or t2i" >&2
     exit 2 ;;
esac
case "${KLEIN:-base}" in
  base) KLEIN_ARGS=(--sampling_steps 8 --guidance_scale 4.0 --eta 0.7 --sde_window_range 1,4) ;;
  distilled) KLEIN_ARGS=(--sampling_steps 4 --guidance_scale 1.0 --eta 0.5 --sde_window_range 1,3) ;;
  *) echo "KLEIN=${KLEIN}: use base (FLUX.2-klein-base-*, guidance 4.0) or distilled (FLUX.2-klein-*, no guidance)" >&2
     exit 2 ;;
esac
GRPO_ARGS=(
  "${TASK_ARGS[@]}"
  --h 384 --w 384 --t 1 --num_latent_t 1
  "${KLEIN_ARGS[@]}"
  --flow_grpo_sampling --sde_steps 1 --sde_start random
  --pipeline_shift --no_quantize_timestep
  --num_generations 16 --use_group --adv_std population
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0 --weight_decay 0.0001
  --learning_rate 1e-5 --lr_warmup_steps 0
  --trainable_modules "${TRAINABLE_MODULES:-all}" --master_weight_type "${MASTER_WEIGHT_TYPE:-fp32}"
  --rewards "${REWARDS:-pickscore:1.0}"
  --checkpointing_steps 20 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/flux2}"
  --data_json_path "${DATA_JSON:-$TASK_DATA/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/flux2_klein_grpo}"
  --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 4 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-8}"
  --max_train_steps 300 --dataloader_num_workers 4
)
