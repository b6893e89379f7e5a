# DiffusionNFT's training flags (NVlabs/DiffusionNFT 24af555 config/nft.py + config/base.py, SD3.5-M), shared by the
# NFT launchers (docs/nft.md): for SD3.5 as the reference runs them (NFT_FAMILY=sd3), for FLUX.1-dev translated
# (NFT_FAMILY=flux, the default). Sourced after scripts/common.sh; sets NFT_ARGS.
# Reads: NPROC (ranks; the launcher's default), NFT_GROUPS (prompt groups per optimizer step, default 48),
# MODEL_PATH, DATA_JSON, OUTPUT_DIR, HPS_DIR / PICKSCORE_DIR, REWARDS, GA (default: one optimizer step per iteration).
#   reference                                   here
#   LoRA r 32, alpha 64, lr 3e-4                --use_lora --lora_rank 32 --lora_alpha 64 --learning_rate 3e-4
#                                               (SD3: the reference's eight attention projections, train_nft_sd3.py L420-431)
#   sample.num_steps 10, solver dpm2, determ.   --sampling_steps 10 --nft_solver dpm
#   guidance_scale 1.0 (no CFG, nft.py L64)     SD3: --guidance_scale 1; FLUX: --cfg 0, its distilled guidance
#                                               embedding 3.5 (not CFG)
#   the scheduler's grid, decodes the final     SD3: --sigma_grid diffusers (pipeline_with_logprob.py L179-183);
#   latents (pipeline_with_logprob.py L254-260) both: --decode_from final_sample (FLUX: the shifted linspace, shift 3;
#                                               the reference's FLUX grid is FluxPipeline's dynamic shift)
#   the scheduler's timesteps, unrounded        SD3: --no_quantize_timestep
#   resolution 512                              --h 512 --w 512
#   num_image_per_prompt 24, per-prompt stats   --num_generations 24 --use_group (init noise per sample)
#   sample.global_std True (np.std of all)      --global_std --adv_std population
#   48 groups (1,152 samples), one optimizer    NFT_GROUPS / NPROC prompts per rank (--train_batch_size: 6 on 8
#   step per epoch (nft.py L29,                 ranks, 3 on 16), micro-batches of 1, GA = those x 24 samples
#   gradient_step_per_epoch 1)                  (144 / 72): one step over all 48 groups, as the reference
#   timestep_fraction 0.99                      --timestep_fraction 0.99 (9 of the 10 timesteps)
#   beta 1.0, decay_type 1, adv_mode all        --nft_beta 1.0 --nft_decay_type 1 --adv_mode all
#   adv_clip_max 5, train.beta (KL) 1e-4        --adv_clip_max 5 --kl_coef 1e-4 (vs the base: adapters off)
#   max_grad_norm 1.0, adam wd 1e-4             --max_grad_norm 1.0 --weight_decay 1e-4
#   EMA 0.9, warmed up, saved as the checkpoint --use_ema --ema_decay 0.9 --ema_warmup --export_ema (flow_grpo/ema.py
#                                               L25-26; save_ckpt, train_nft_sd3.py L342-352)
#   mixed_precision fp16                        --mixed_precision bf16 (fp16 is refused here; loss in fp32)
NFT_FAMILY=${NFT_FAMILY:-flux}
NFT_GROUPS=${NFT_GROUPS:-48}
if (( NFT_GROUPS % NPROC )); then
  echo "NFT_GROUPS=$NFT_GROUPS prompt groups per optimizer step must be a multiple of NPROC=$NPROC (a group stays on one rank)" >&2
  exit 2
fi
NFT_PROMPTS_PER_RANK=$(( NFT_GROUPS / NPROC ))
case "$NFT_FAMILY" in
  flux)
    MODEL_PATH=${MODEL_PATH:-data/flux}
    HPS_DIR=${HPS_DIR:-hps_ckpt}
    NFT_FAMILY_ARGS=(
      --vae_model_path "$MODEL_PATH" --cfg 0.0 --shift 3
      --data_json_path "${DATA_JSON:-data/rl_embeddings/videos2caption.json}"
      --output_dir "${OUTPUT_DIR:-data/outputs/nft}"
      --rewards "${REWARDS:-hpsv2:1.0}" --hps_ckpt_dir "$HPS_DIR"
    );;
  sd3)
    MODEL_PATH=${MODEL_PATH:-data/sd3}
    NFT_FAMILY_ARGS=(
      --model_family sd3 --guidance_scale 1.0 --shift 3 --sigma_grid diffusers --no_quantize_timestep
      --lora_target_modules attn.add_k_proj,attn.add_q_proj,attn.add_v_proj,attn.to_add_out,attn.to_k,attn.to_out.0,attn.to_q,attn.to_v
      --data_json_path "${DATA_JSON:-data/rl_embeddings_sd3/videos2caption.json}"
      --output_dir "${OUTPUT_DIR:-data/outputs/sd3_nft}"
      --rewards "${REWARDS:-pickscore:1.0}" --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}"
    );;
  *)
    echo "NFT_FAMILY=$NFT_FAMILY: flux or sd3" >&2
    exit 2;;
esac
NFT_ARGS=(
  --algorithm nft
  --seed 42
  --pretrained_model_name_or_path "$MODEL_PATH"
  "${NFT_FAMILY_ARGS[@]}"
  --gradient_checkpointing
  --train_batch_size "$NFT_PROMPTS_PER_RANK"
  --dataloader_num_workers 4
  --gradient_accumulation_steps "${GA:-$(( NFT_PROMPTS_PER_RANK * 24 ))}"
  --max_train_steps 300
  --learning_rate 3e-4
  --use_lora
  --lora_rank 32
  --lora_alpha 64
  --mixed_precision bf16
  --checkpointing_steps 20
  --allow_tf32
  --h 512
  --w 512
  --sampling_steps 10
  --nft_solver dpm
  --decode_from final_sample
  --lr_warmup_steps 0
  --max_grad_norm 1.0
  --weight_decay 0.0001
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
  --ema_warmup
  --export_ema
  --rollout_batch_size 4
  --train_micro_batch_size 1
)
