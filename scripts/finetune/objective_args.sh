# The training flags of the objectives after DiffusionNFT (docs/objectives.md) for FLUX.1-dev, shared by their
# launchers (finetune_flux_{awm,dgpo,flash_grpo}_{8gpus,a3_16die}.sh): the peers' recipes translated flag by flag.
# Sourced after scripts/common.sh with OBJ=awm|dgpo|flash_grpo and NPROC set; sets OBJ_ARGS.
# Reads: OBJ_GROUPS (prompt groups per optimizer step), MODEL_PATH, DATA_JSON, OUTPUT_DIR, REWARDS, GA.
# Every recipe: FLUX with its distilled guidance embedding (--cfg 0; Flow-Factory's guidance_scale 3.5),
# the shifted linspace grid with shift 3 (Flow-Factory's time_shift 3.0), bf16 autocast.
#
# AWM: Flow-Factory X-GenGroup/Flow-Factory at a0b2bc5, examples/awm/lora/flux1/default.yaml
#   LoRA r 64, alpha 128, lr 3e-4, wd 1e-4      --use_lora --lora_rank 64 --lora_alpha 128 --learning_rate 3e-4
#   max_grad_norm 1.0, seed 42                  --max_grad_norm 1.0 --weight_decay 0.0001 --seed 42
#   awm_weighting ghuber, ghuber_power 0.25     --awm_weighting ghuber --awm_ghuber_power 0.25
#   num_inference_steps 10, dynamics ODE        --sampling_steps 10 (the Euler ODE: --algorithm awm's)
#   num_train_timesteps 4                       --timestep_fraction 0.4 (4 of the 10)
#   clip_range 1, adv_clip_range 1.0            --clip_range 1.0 --adv_clip_max 1.0
#   group_size 16, global_std true              --num_generations 16 --use_group --global_std --adv_std population
#   48 prompts, gradient_step_per_epoch 1       OBJ_GROUPS 48: 6 (8 ranks) / 3 (16) prompts per rank, GA = those x 16
#   resolution 512                              --h 512 --w 512
#   kl_beta 0; ema_kl_beta 0.1, ema_decay 0.3,   --awm_ema_kl_beta 0.1 (--awm_ema_decay 0.3, --awm_ema_warmup 300,
#   linear schedule, warmup_steps 300, interval 1  --awm_ema_interval 1: the defaults): the KL to an EMA of the weights
# DGPO: Flow-Factory at a0b2bc5, examples/dgpo/lora/sd3_5/default.yaml (its only DGPO recipe: SD3.5's, on FLUX)
#   LoRA r 64, alpha 128, lr 3e-4, wd 1e-4      --use_lora --lora_rank 64 --lora_alpha 128 --learning_rate 3e-4
#   dpo_beta 10, clip_dsm, clip_range 5e-2      --dgpo_beta 10 --dgpo_clip_dsm 1 --clip_range 0.05
#   kl_beta 1e-3 (v-based), adv_clip_range 5    --kl_coef 0.001 --adv_clip_max 5.0
#   switch_ema_ref 200, ema_ref 0.3 / 0.001     --dgpo_switch_ema_ref 200 --dgpo_ema_max_decay 0.3 --dgpo_ema_ramp 0.001
#   num_train_timesteps 4 of 10 steps           --sampling_steps 10 --timestep_fraction 0.4
#   group_size 24, global_std true              --num_generations 24 --use_group --global_std --adv_std population
#   24 groups, gradient_step_per_epoch 1        OBJ_GROUPS 24 on 8 ranks (3 each), 32 on 16 (2 each: 24 does not
#                                               divide), micro-batches of a whole group (24), GA = groups per rank
#   ema_decay 0.9, constant, interval 8         --use_ema --ema_decay 0.9 --ema_update_interval 8 (the model's EMA)
#   resolution 512                              --h 512 --w 512
# Flash-GRPO: the authors' Wan2.1 recipe, Shredded-Pork/Flash-GRPO at 4211013 (config/dgx.py wan2_1_flash,
# config/base.py, scripts/train_wanx2_1_flash.py)
#   LoRA r 16, alpha 32 (train L467-471)        --use_lora --lora_rank 16 --lora_alpha 32
#   lr 1e-4, wd 1e-4, max_grad_norm 1.0         --learning_rate 1e-4 --weight_decay 0.0001 --max_grad_norm 1.0
#   num_steps 20, SDE step from the first 10    --sampling_steps 20 --flash_candidate_fraction 0.5
#   its SDE has no eta                          --eta 1
#   clip_range 1e-3, adv_clip_max 5, beta 0     --clip_range 0.001 --adv_clip_max 5.0 (no KL term)
#   num_image_per_prompt 4, per-prompt stats,   --num_generations 4 --use_group --global_std --adv_std population
#   global_std True
#   one prompt's samples per micro-batch, an    --train_batch_size 1 --train_micro_batch_size 4, GA 1: one prompt
#   optimizer step each (train L957-1040)       per rank per optimizer step
#   EMA decay 0.9, update_step_interval 8       --use_ema --ema_decay 0.9 --ema_update_interval 8 (train L488, L1042:
#                                               per optimizer step there, one per iteration here)
#   Wan's 480 x 832 video                       FLUX's 720 x 720 (the GRPO launchers')
MODEL_PATH=${MODEL_PATH:-data/flux}
case "$OBJ" in
  awm) OBJ_GROUPS=${OBJ_GROUPS:-48}; G=16;;
  dgpo) if (( NPROC == 8 )); then OBJ_GROUPS=${OBJ_GROUPS:-24}; else OBJ_GROUPS=${OBJ_GROUPS:-32}; fi; G=24;;
  flash_grpo) OBJ_GROUPS=${OBJ_GROUPS:-$NPROC}; G=4;;
  *) echo "OBJ=$OBJ: awm, dgpo or flash_grpo" >&2; exit 2;;
esac
if (( OBJ_GROUPS % NPROC )); then
  echo "OBJ_GROUPS=$OBJ_GROUPS prompt groups per optimizer step must be a multiple of NPROC=$NPROC (a group stays on one rank)" >&2
  exit 2
fi
PROMPTS_PER_RANK=$(( OBJ_GROUPS / NPROC ))
fg_rewards --rewards pickscore:1.0
OBJ_ARGS=(
  --algorithm "$OBJ"
  --seed 42
  --pretrained_model_name_or_path "$MODEL_PATH"
  --vae_model_path "$MODEL_PATH"
  --data_json_path "${DATA_JSON:-data/rl_embeddings/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/$OBJ}"
  "${REWARD_ARGS[@]}"
  --cfg 0.0
  --shift 3
  --gradient_checkpointing
  --dataloader_num_workers 4
  --train_batch_size "$PROMPTS_PER_RANK"
  --max_train_steps 300
  --mixed_precision bf16
  --checkpointing_steps 20
  --allow_tf32
  --lr_warmup_steps 0
  --max_grad_norm 1.0
  --weight_decay 0.0001
  --use_lora
  --num_generations "$G"
  --use_group
  --global_std
  --adv_std population
  --rollout_batch_size 4
)
case "$OBJ" in
  awm) OBJ_ARGS+=(
    --lora_rank 64 --lora_alpha 128 --learning_rate 3e-4 --h 512 --w 512 --sampling_steps 10
    --timestep_fraction 0.4 --clip_range 1.0 --adv_clip_max 1.0 --awm_weighting ghuber --awm_ghuber_power 0.25
    --awm_ema_kl_beta 0.1
    --train_micro_batch_size 1 --gradient_accumulation_steps "${GA:-$(( PROMPTS_PER_RANK * G ))}");;
  dgpo) OBJ_ARGS+=(
    --lora_rank 64 --lora_alpha 128 --learning_rate 3e-4 --h 512 --w 512 --sampling_steps 10
    --timestep_fraction 0.4 --clip_range 0.05 --adv_clip_max 5.0 --kl_coef 0.001 --dgpo_beta 10 --dgpo_clip_dsm 1
    --dgpo_switch_ema_ref 200 --dgpo_ema_max_decay 0.3 --dgpo_ema_ramp 0.001 --use_ema --ema_decay 0.9
    --ema_update_interval 8
    --train_micro_batch_size "$G" --gradient_accumulation_steps "${GA:-$PROMPTS_PER_RANK}");;
  flash_grpo) OBJ_ARGS+=(
    --lora_rank 16 --lora_alpha 32 --learning_rate 1e-4 --h 720 --w 720 --sampling_steps 20 --eta 1.0
    --flash_candidate_fraction 0.5 --clip_range 0.001 --adv_clip_max 5.0 --use_ema --ema_decay 0.9
    --ema_update_interval 8
    --train_micro_batch_size "$(( PROMPTS_PER_RANK * G ))" --gradient_accumulation_steps "${GA:-1}");;
esac
