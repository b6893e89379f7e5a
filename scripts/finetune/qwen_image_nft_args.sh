# Flow-Factory's NFT configuration for Qwen-Image (github.com/X-GenGroup/Flow-Factory at a0b2bc5:
# examples/nft/lora/qwen_image/rational_rewards_t2i.yaml, Qwen/Qwen-Image-2512, LoRA: its only Qwen-Image NFT
# configuration), as this trainer's --algorithm nft flags (docs/nft.md). Sourced through
# scripts/finetune/current_line_grpo.sh (it runs GRPO_ARGS, whatever the objective) by
# finetune_qwen_image_nft_8gpus.sh and finetune_qwen_image_nft_a3_16die.sh, which set PROMPTS_PER_RANK and
# ACCUMULATION for their world size.
# Overridable: MODEL_PATH (data/qwen_image: a Qwen-Image folder; FF's is Qwen-Image-2512), DATA_JSON, OUTPUT_DIR,
# PICKSCORE_DIR, ROLLOUT_BATCH_SIZE (8), REWARDS, MASTER_WEIGHT_TYPE (fp32).
# Each value's source (FF = that yaml):
#   --algorithm nft           FF train.trainer_type: "nft"
#   --h/--w 512               FF train.resolution: 512
#   --sampling_steps 30 --guidance_scale 4.0
#                             FF train.num_inference_steps: 30, guidance_scale: 4.0 (true CFG with the negative " ":
#                             FF encodes "", docs/qwen_image.md measures the difference)
#   --nft_solver ode          FF scheduler.dynamics_type: "ODE" (Euler rollouts)
#   --pipeline_shift --no_quantize_timestep
#                             QwenImagePipeline's size-dependent shift and shift_terminal, as qwen_image_grpo_args.sh
#   --nft_beta 1.0            FF train.nft_beta: 1.0
#   --nft_decay_type 1        FF train.off_policy: true (rollouts from the EMA of the policy: this trainer's old
#                             policy), ema_decay_schedule piecewise_linear, flat_steps 0, ramp_rate 0.001,
#                             ema_decay 0.5, ema_update_interval 1: min(0.001 step, 0.5), the reference's type 1
#   --timestep_fraction 0.34  FF train.num_train_timesteps: 10 (10 of the 30 steps: int(30 x 0.34)). FF draws them in
#                             scheduler time [500, 1000] (timestep_range 0.5, time_sampling_strategy discrete,
#                             time_shift 3; src/flow_factory/utils/noise_schedule.py); here 10 of the rollout's own
#                             30 timesteps, a seeded permutation per sample: not reproduced
#   kl: none                  FF train.kl_beta: 0 (its clip_range 1.0e-4 is not passed: this NFT loss clips no ratio)
#   --num_generations 16 --use_group --adv_std population
#                             FF train.group_size: 16, advantage_aggregation "gdpo", global_std false
#   --adv_clip_max 5          FF train.adv_clip_range: 5.0
#   --use_lora --lora_rank 64 --lora_alpha 128 --learning_rate 2e-4
#                             FF model.finetune_type "lora", lora_rank 64, lora_alpha 128, train.learning_rate 2.0e-4
#   --lora_target_modules     FF model.target_modules "default": qwen_image.py's default_target_modules less
#                             img_mlp.net.2.proj / txt_mlp.net.2.proj, which name no module of the transformer
#                             (peft skips them there too): the same adapters
#   --master_weight_type fp32 FF model.master_weight_dtype: bfloat16 by default (src/flow_factory/hparams/
#                             model_args.py): adapters in bf16, trained in place; here fp32 adapters (an AdamW update
#                             below half a bf16 spacing rounds away in bf16); MASTER_WEIGHT_TYPE=bf16 runs the peer's
#   --weight_decay 1e-4       FF train.adam_weight_decay: 1.0e-4 (betas 0.9 / 0.999, eps 1e-8: AdamW defaults here)
#   --max_grad_norm 1.0       FF train.max_grad_norm: 1.0
#   --seed 42 --checkpointing_steps 20 --mixed_precision bf16
#                             FF train.seed 42, log.save_freq 20, mixed_precision "bf16"
#   batch                     FF unique_sample_num_per_epoch 32 x group 16, one gradient step per epoch: 32 / world
#                             size prompts per rank (PROMPTS_PER_RANK), micro-batches of 2 accumulated over all of
#                             a rank's samples (ACCUMULATION): one optimizer step per iteration
#   --rewards pickscore:1.0   NOT FF's: its reward is rational_rewards_t2i, the RationalRewards-8B-T2I VLM behind an
#                             OpenAI-compatible server (aspects text_faithfulness, physical_quality, text_rendering),
#                             which this trainer does not ship; PickScore stands in (REWARDS= chooses another,
#                             e.g. a served reward, docs/rewards.md)
# Chosen here (no source): --max_train_steps 300, --rollout_batch_size 8, --gradient_checkpointing, --allow_tf32.
# Not reproduced: FF's evaluation (512 px, every 10 epochs).
# The embeddings: bash scripts/preprocess/preprocess_qwen_image_rl_embeddings.sh (with the negative prompt " ").
GRPO_ARGS=(
  --algorithm nft
  --model_family qwen_image
  --h 512 --w 512 --t 1 --num_latent_t 1
  --sampling_steps 30 --guidance_scale 4.0 --nft_solver ode
  --pipeline_shift --no_quantize_timestep
  --nft_beta 1.0 --nft_decay_type 1 --adv_mode all --timestep_fraction 0.34
  --num_generations 16 --use_group --adv_std population --adv_clip_max 5.0
  --max_grad_norm 1.0 --weight_decay 0.0001 --learning_rate 2e-4 --lr_warmup_steps 0
  --use_lora --lora_rank 64 --lora_alpha 128
  --lora_target_modules attn.to_k,attn.to_q,attn.to_v,attn.to_out.0,attn.add_q_proj,attn.add_k_proj,attn.add_v_proj,attn.to_add_out,img_mlp.net.0.proj,txt_mlp.net.0.proj
  --master_weight_type "${MASTER_WEIGHT_TYPE:-fp32}"
  --rewards "${REWARDS:-pickscore:1.0}"
  --checkpointing_steps 20 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/qwen_image}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_qwen_image/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/qwen_image_nft}"
  --pickscore_dir "${PICKSCORE_DIR:-data/pickscore}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 2 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-8}"
  --max_train_steps 300 --dataloader_num_workers 4
)
