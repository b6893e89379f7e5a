# Flow-GRPO's PickScore configuration for SD3.5-Medium (config/grpo.py:pickscore_sd3 of
# github.com/yifan123/flow_grpo at ac4c86e, its config/base.py defaults and scripts/train_sd3.py),
# as this trainer's flags, and the launch settings both launchers share. Sourced by
# finetune_sd3_grpo_8gpus.sh and finetune_sd3_grpo_a3_16die.sh. Overridable: MODEL_PATH (data/sd3),
# DATA_JSON, OUTPUT_DIR, PICKSCORE_DIR (data/pickscore), ROLLOUT_BATCH_SIZE (8).
# Each value's source:
#   --h/--w 512               pickscore_sd3: config.resolution = 512
#   --sampling_steps 10       pickscore_sd3: config.sample.num_steps = 10
#   --guidance_scale 4.5      pickscore_sd3: config.sample.guidance_scale = 4.5 (classifier-free guidance,
#                             in the rollout and, base.py train.cfg = True, in the update's log-probs)
#   --eta 0.7                 base.py: sample.noise_level = 0.7
#   --flow_grpo_sampling      sd3_sde_with_logprob: std = sqrt(sigma / (1 - sigma)) * noise_level
#   --shift 3                 SD3.5-M's scheduler_config.json (FlowMatchEulerDiscreteScheduler shift 3.0)
#   --no_quantize_timestep    the pipeline passes the scheduler's timesteps (1000 sigma) unrounded
#   --sigma_grid diffusers    sd3_pipeline_with_logprob.py: retrieve_timesteps(scheduler, num_steps, sigmas=None),
#                             FlowMatchEulerDiscreteScheduler's grid (10 steps: 1, .960 ... .278, .0089, 0)
#   --decode_from final_sample
#                             sd3_pipeline_with_logprob.py: vae.decode(latents) after the last sde_step_with_logprob
#   --num_generations 24      pickscore_sd3: sample.num_image_per_prompt = 24
#   --timestep_fraction 1.0   pickscore_sd3: train.timestep_fraction = 0.99 trains int(10 * 0.99) = 9 steps,
#                             transitions 0..8; here T = int(9 candidates * fraction), so 1.0 gives those 9
#   --clip_range 1e-4         base.py: train.clip_range = 1e-4
#   --adv_clip_max 5          base.py: train.adv_clip_max = 5
#   --max_grad_norm 1.0       base.py: train.max_grad_norm = 1.0
#   --weight_decay 1e-4       base.py: train.adam_weight_decay = 1e-4
#   --learning_rate 3e-4      base.py: train.learning_rate = 3e-4
#   --use_lora, rank 32, alpha 64, the eight attention projections
#                             compressibility() (which pickscore_sd3 starts from): use_lora = True;
#                             train_sd3.py: LoraConfig(r=32, lora_alpha=64, target_modules=[...])
#   --rewards pickscore:1.0   pickscore_sd3: reward_fn = {"pickscore": 1.0}
#   --use_group               base.py: per_prompt_stat_tracking = True (advantages within a prompt's group)
#   --global_std --adv_std population
#                             pickscore_sd3: sample.global_std = True: each prompt's mean, np.std of ALL the
#                             epoch's rewards + 1e-4 (stat_tracking.py PerPromptStatTracker)
#   --checkpointing_steps 60  pickscore_sd3: save_freq = 60
#   --seed 42                 base.py: seed = 42
#   --kl_coef 0.01            pickscore_sd3: train.beta = 0.01, the KL of the step means to the base (adapters
#                             off) / (2 std_dev_t^2), train_sd3.py's kl_loss, on the guided velocities
#   --mixed_precision bf16    Flow-GRPO uses fp16, which this trainer refuses (FLUX overflows); bf16 instead
#   --train_batch_size 1, --train_micro_batch_size 4, --gradient_accumulation_steps 3: one prompt
#                             (24 images) per rank, 2 optimizer steps per iteration as Flow-GRPO's 2 per epoch
# Not reproduced (see docs/sd3.md): the EMA (decay 0.9 every 8 steps, used for evaluation only), and the batch
# split: Flow-GRPO spreads a prompt's 24 images over GPUs, this trainer keeps a group on one rank.
SD3_GRPO_ARGS=(
  --model_family sd3
  --h 512 --w 512 --t 1 --num_latent_t 1
  --sampling_steps 10 --guidance_scale 4.5 --eta 0.7 --flow_grpo_sampling --shift 3 --no_quantize_timestep
  --sigma_grid diffusers --decode_from final_sample
  --num_generations 24 --use_group --global_std --adv_std population --timestep_fraction 1.0
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0 --weight_decay 0.0001
  --learning_rate 3e-4 --lr_warmup_steps 0
  --use_lora --lora_rank 32 --lora_alpha 64
  --lora_target_modules attn.add_k_proj,attn.add_q_proj,attn.add_v_proj,attn.to_add_out,attn.to_k,attn.to_out.0,attn.to_q,attn.to_v
  --rewards "${REWARDS:-pickscore:1.0}"
  --kl_coef 0.01
  --checkpointing_steps 60 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/sd3}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_sd3/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/sd3_grpo}"
  --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}"
  --train_batch_size 1 --train_micro_batch_size 4 --gradient_accumulation_steps 3
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-8}"
  --max_train_steps 300 --dataloader_num_workers 4
)
