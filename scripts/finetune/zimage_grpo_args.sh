# Flow-Factory's GRPO configuration for Z-Image (github.com/X-GenGroup/Flow-Factory at 5f6cda1:
# examples/grpo/full/z_image/default.yaml for Tongyi-MAI/Z-Image, the default here, and
# examples/grpo/full/z_image_turbo/default.yaml for Z-Image-Turbo, ZIMAGE=turbo), as this trainer's
# flags. Sourced through scripts/finetune/current_line_grpo.sh by finetune_zimage_grpo_8gpus.sh and
# finetune_zimage_grpo_a3_16die.sh, which set PROMPTS_PER_RANK and ACCUMULATION for their world size.
# Overridable: ZIMAGE (base | turbo), MODEL_PATH (data/zimage: Z-Image, or Z-Image-Turbo with
# ZIMAGE=turbo), DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR, ROLLOUT_BATCH_SIZE (8), REWARDS.
# Also overridable: TRAINABLE_MODULES (all) and MASTER_WEIGHT_TYPE (fp32), the peer's choices below.
# Each value's source (FF = Flow-Factory's yaml; base / turbo where they differ):
#   --h/--w 512               FF train.resolution: 512 (both)
#   --sampling_steps 10 / 6   FF train.num_inference_steps: 10 / 6
#   --guidance_scale 4.0 / 0  FF train.guidance_scale: 4.0 / 0 (ZImagePipeline's convention: v_c + s (v_c - v_u),
#                             on for any scale > 0; Turbo is distilled to run without it)
#   --flow_grpo_sampling      FF scheduler.dynamics_type: "Flow-SDE" (Flow-GRPO's SDE)
#   --eta 0.7                 FF scheduler.noise_level: 0.7 (both)
#   --sde_steps 1 --sde_start random --sde_window_range 1,4
#                             FF scheduler.num_sde_steps: 1, sde_steps: [1, 2, 3] (both): one SDE (and trained)
#                             step per rollout drawn from those transitions; ODE elsewhere
#   --shift 3 --no_quantize_timestep
#                             Z-Image's scheduler_config.json: shift 3.0 without dynamic shifting (the mu
#                             ZImagePipeline computes is unused); its timestep (1000 - 1000 sigma) / 1000 unrounded
#   --num_generations 16      FF train.group_size: 16
#   --use_group --adv_std population
#                             FF advantage_aggregation "gdpo" with one reward: each group's (r - mean) / np.std
#                             (its batch re-normalisation afterwards is not reproduced)
#   --clip_range 1e-4         FF train.clip_range: 1.0e-4
#   --adv_clip_max 5          FF train.adv_clip_range: 5.0
#   --learning_rate 1e-5      FF optimizers[0].learning_rate: 1.0e-5 (finetune_type full; trainable
#                             parameters in fp32: this trainer's master weights are fp32)
#   --weight_decay 1e-4       FF optimizers[0].weight_decay: 1.0e-4 (betas 0.9 / 0.999, eps 1e-8: AdamW defaults here)
#   --max_grad_norm 1.0       FF optimizers[0].max_grad_norm: 1.0
#   --rewards pickscore:1.0   FF rewards: PickScore, weight 1
#   --seed 42                 FF train.seed: 42
#   --checkpointing_steps 40  FF log.save_freq: 40
#   --mixed_precision bf16    FF mixed_precision: "bf16"
#   --trainable_modules all   FF model.target_modules: "default" (examples/grpo/full/z_image/default.yaml
#                             at a0b2bc5): Flow-Factory trains its family's default modules only (98%
#                             of the transformer, fastvideo/training/trainable.py); here every weight
#                             (the default, as before); TRAINABLE_MODULES=peer trains the peer's set
#   --master_weight_type fp32 FF model.master_weight_dtype: "fp32" (examples/grpo/full/z_image/default.yaml: "Z-Image requires fp32
#                             master weight"), as here (the default); MASTER_WEIGHT_TYPE=bf16 trains bf16
#                             weights in place (Flow-Factory's default for its other families)
#   kl: none                  FF train.kl_beta: 0
#   batch                     FF unique_sample_num_per_epoch 48 x group 16 and gradient_step_per_epoch 2:
#                             48 / world size prompts per rank (PROMPTS_PER_RANK), micro-batches of 4
#                             accumulated so that each iteration makes 2 optimizer steps (ACCUMULATION)
# Chosen here (no source): --max_train_steps 300 (FF gives no epoch count), --rollout_batch_size 8 and
# --train_micro_batch_size 4 (memory only), --gradient_checkpointing (FF: off; docs/zimage.md's memory
# verdicts are computed with it), --allow_tf32.
# Not reproduced: FF's EMA (decay 0.9 every 4 epochs, evaluation only) and its evaluation at 1024 px.
# The embeddings: bash scripts/preprocess/preprocess_zimage_rl_embeddings.sh (Qwen3, 512 tokens, with the empty prompt).
case "${ZIMAGE:-base}" in
  base) ZIMAGE_ARGS=(--sampling_steps 10 --guidance_scale 4.0) ;;
  turbo) ZIMAGE_ARGS=(--sampling_steps 6 --guidance_scale 0) ;;
  *) echo "ZIMAGE=${ZIMAGE}: use base (Z-Image, guidance 4.0) or turbo (Z-Image-Turbo, no guidance)" >&2
     exit 2 ;;
esac
GRPO_ARGS=(
  --model_family zimage
  --h 512 --w 512 --t 1 --num_latent_t 1
  "${ZIMAGE_ARGS[@]}"
  --eta 0.7 --flow_grpo_sampling --sde_steps 1 --sde_start random --sde_window_range 1,4
  --shift 3 --no_quantize_timestep
  --num_generations 16 --use_group --adv_std population
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0 --weight_decay 0.0001
  --learning_rate 1e-5 --lr_warmup_steps 0
  --trainable_modules "${TRAINABLE_MODULES:-all}" --master_weight_type "${MASTER_WEIGHT_TYPE:-fp32}"
  --rewards "${REWARDS:-pickscore:1.0}"
  --checkpointing_steps 40 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/zimage}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_zimage/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/zimage_grpo}"
  --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 4 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-8}"
  --max_train_steps 300 --dataloader_num_workers 4
)
