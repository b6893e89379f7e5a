# DiffusionNFT's training flags (NVlabs/DiffusionNFT config/nft.py + config/base.py, SD3.5-M), translated
# to FLUX.1-dev, shared by the NFT launchers (docs/nft.md). Sourced after scripts/common.sh; sets NFT_ARGS.
# Reads: MODEL_PATH, DATA_JSON, OUTPUT_DIR, HPS_DIR, GA (gradient accumulation, default 24: one
# optimizer step per iteration, the reference's gradient_step_per_epoch 1).
#   reference                                   here
#   LoRA r 32, alpha 64, lr 3e-4                --use_lora --lora_rank 32 --lora_alpha 64 --learning_rate 3e-4
#   sample.num_steps 10, solver dpm2, determ.   --sampling_steps 10 --nft_solver dpm
#   guidance_scale 1.0 (no CFG)                 --cfg 0 (no CFG); FLUX.1-dev's distilled guidance embedding 3.5
#   resolution 512                              --h 512 --w 512
#   num_image_per_prompt 24, per-prompt stats   --num_generations 24 --use_group (init noise per sample)
#   sample.global_std True (np.std of all)      --global_std --adv_std population
#   timestep_fraction 0.99                      --timestep_fraction 0.99 (9 of the 10 timesteps)
#   beta 1.0, decay_type 1, adv_mode all        --nft_beta 1.0 --nft_decay_type 1 --adv_mode all
#   adv_clip_max 5, train.beta (KL) 1e-4        --adv_clip_max 5 --kl_coef 1e-4 (vs the base: adapters off)
#   max_grad_norm 1.0, adam wd 1e-4, ema 0.9    --max_grad_norm 1.0 --weight_decay 1e-4 --use_ema --ema_decay 0.9
#   mixed_precision fp16                        --mixed_precision bf16 (fp16 is refused here; loss in fp32)
MODEL_PATH=${MODEL_PATH:-data/flux}
HPS_DIR=${HPS_DIR:-hps_ckpt}
NFT_ARGS=(
  --algorithm nft
  --seed 42
  --pretrained_model_name_or_path "$MODEL_PATH"
  --vae_model_path "$MODEL_PATH"
  --data_json_path "${DATA_JSON:-data/rl_embeddings/videos2caption.json}"
  --gradient_checkpointing
  --train_batch_size 1
  --dataloader_num_workers 4
  --gradient_accumulation_steps "${GA:-24}"
  --max_train_steps 300
  --learning_rate 3e-4
  --use_lora
  --lora_rank 32
  --lora_alpha 64
  --mixed_precision bf16
  --checkpointing_steps 20
  --allow_tf32
  --cfg 0.0
  --output_dir "${OUTPUT_DIR:-data/outputs/nft}"
  --h 512
  --w 512
  --sampling_steps 10
  --nft_solver dpm
  --shift 3
  --lr_warmup_steps 0
  --max_grad_norm 1.0
  --weight_decay 0.0001
  --rewards "${REWARDS:-hpsv2:1.0}"
  --hps_ckpt_dir "$HPS_DIR"
  --num_generations 24
  --use_group
  --global_std
  --adv_std population
  --timestep_fraction 0.99
  --nft_beta 1.0
  --nft_decay_type 1
  --adv_mode all
  --adv_clip_max 5.0
  --kl_coef 0.0001
  --use_ema
  --ema_decay 0.9
  --rollout_batch_size 4
  --train_micro_batch_size 1
)
