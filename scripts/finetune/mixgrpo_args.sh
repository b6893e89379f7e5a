# MixGRPO's training flags (Tencent-Hunyuan/MixGRPO scripts/finetune/finetune_flux_grpo_MixGRPO{,_Flash,_Flash*}.sh),
# shared by the MixGRPO launchers. Sourced after scripts/common.sh; sets MIXGRPO_ARGS.
# Reads: MODEL_PATH, DATA_JSON, OUTPUT_DIR, HPS_DIR, IMAGE_REWARD_DIR, PICKSCORE_DIR, REWARD_MODEL,
# UNIFIED_REWARD_URL, REWARDS (a --rewards spec instead of MixGRPO's reward flags), FLASH (0: MixGRPO, 1: MixGRPO-Flash, star: MixGRPO-Flash*, whose window stays
# at the first 4 steps and whose DPM tail keeps 20 %).
# The reward is MixGRPO's: multi_reward = HPSv2.1 + ImageReward + PickScore, each weight 1 / 3, and
# UnifiedReward too when UNIFIED_REWARD_URL names its server(s) (MixGRPO's scripts pass None: no judge);
# --multi_reward_mix advantage_aggr. REWARD_MODEL=hpsv2 scores HPS alone.
# Nodes: MixGRPO's scripts run 4 nodes x 8 GPUs = 32 ranks with these per-rank settings (1 prompt x
# 12 samples, 3 micro-batches per optimizer step), so each of its optimizer steps averages 32 x 3
# samples; the 8-device launcher averages 8 x 3 (a quarter), the 16-die one 16 x 3 (a half). Launch
# 32 ranks (torchrun --nnodes 4) for upstream's step; the per-rank flags need no change.
MODEL_PATH=${MODEL_PATH:-data/flux}
HPS_DIR=${HPS_DIR:-hps_ckpt}
IMAGE_REWARD_DIR=${IMAGE_REWARD_DIR:-image_reward_ckpt}
PICKSCORE_DIR=${PICKSCORE_DIR:-data/pickscore}
PROG_OVERLAP_STEP=1; DPM_RATIO=0.4
case "${FLASH:-0}" in
  1) ITERS_PER_GROUP=20; DPM_ALGORITHM=dpmsolver++; DEFAULT_OUT=data/outputs/mixgrpo_flash ;;
  star) ITERS_PER_GROUP=20; DPM_ALGORITHM=dpmsolver++; DEFAULT_OUT=data/outputs/mixgrpo_flash_star
        PROG_OVERLAP_STEP=0; DPM_RATIO=0.2 ;;
  0) ITERS_PER_GROUP=25; DPM_ALGORITHM=null; DEFAULT_OUT=data/outputs/mixgrpo ;;
  *) echo "FLASH=${FLASH}: use 0 (MixGRPO), 1 (MixGRPO-Flash) or star (MixGRPO-Flash*)" >&2; exit 2 ;;
esac
# MixGRPO's DPM-Solver tail (Flash, Flash*); MixGRPO's own FLASH=0 script passes them too with
# --dpm_algorithm_type null, where they do nothing: left out here, so no start-up note says so.
DPM_ARGS=()
if [ "$DPM_ALGORITHM" != null ]; then
  DPM_ARGS=(--dpm_algorithm_type "$DPM_ALGORITHM" --dpm_apply_strategy post --dpm_post_compress_ratio "$DPM_RATIO"
            --dpm_solver_order 2 --dpm_solver_type midpoint)
fi
# MixGRPO's reward flags; REWARDS=SPEC replaces them (fg_rewards, scripts/common.sh).
fg_rewards \
  --reward_model "${REWARD_MODEL:-multi_reward}" \
  --hps_path "$HPS_DIR/HPS_v2.1_compressed.pt" \
  --hps_clip_path "$HPS_DIR/open_clip_pytorch_model.bin" \
  --image_reward_path "$IMAGE_REWARD_DIR/ImageReward.pt" \
  --image_reward_med_config "$IMAGE_REWARD_DIR/med_config.json" \
  --pickscore_dir "$PICKSCORE_DIR" \
  --unified_reward_url "${UNIFIED_REWARD_URL:-None}" \
  --multi_reward_mix advantage_aggr \
  --hps_weight 1.0 \
  --clip_score_weight 1.0 \
  --image_reward_weight 1.0 \
  --pick_score_weight 1.0 \
  --unified_reward_weight 1.0
MIXGRPO_ARGS=(
  --seed 714
  --pretrained_model_name_or_path "$MODEL_PATH"
  --vae_model_path "$MODEL_PATH"
  --data_json_path "${DATA_JSON:-data/rl_embeddings/videos2caption.json}"
  --gradient_checkpointing
  --train_batch_size 1
  --num_latent_t 1
  --sp_size 1
  --dataloader_num_workers 4
  --gradient_accumulation_steps 3
  --max_train_steps 300
  --learning_rate 1e-5
  --mixed_precision bf16
  --checkpointing_steps 50
  --allow_tf32
  --cfg 0.0
  --output_dir "${OUTPUT_DIR:-$DEFAULT_OUT}"
  --h 720
  --w 720
  --t 1
  --sampling_steps 25
  --eta 0.7
  --lr_warmup_steps 0
  --sampler_seed 7144
  --max_grad_norm 1.0
  --weight_decay 0.0001
  --num_generations 12
  --shift 3
  --use_group
  --timestep_fraction 0.6
  --init_same_noise
  --clip_range 1e-4
  --adv_clip_max 5.0
  --training_strategy part
  --kl_coeff 0.0
  --iters_per_group "$ITERS_PER_GROUP"
  --group_size 4
  --sample_strategy progressive
  --prog_overlap
  --prog_overlap_step "$PROG_OVERLAP_STEP"
  --max_iters_per_group 10
  --min_iters_per_group 1
  --roll_back
  --trimmed_ratio 0.0
  "${REWARD_ARGS[@]}"
  "${DPM_ARGS[@]}"
  --frozen_init_timesteps -1
  --flow_grpo_sampling
  --rollout_batch_size 4
  --train_micro_batch_size 1
)
