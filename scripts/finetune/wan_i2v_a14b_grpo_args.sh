# Flow-Factory's GRPO configuration for Wan2.2-I2V-A14B's two experts (image to video; github.com/X-GenGroup/
# Flow-Factory at 5f6cda1: examples/grpo/full/wan22/i2v.yaml, full fine-tuning, 8 processes), as this trainer's
# flags. Sourced through scripts/finetune/current_line_grpo.sh by finetune_wan_i2v_a14b_grpo_8gpus.sh and
# finetune_wan_i2v_a14b_grpo_a3_16die.sh, which set PROMPTS_PER_RANK and ACCUMULATION for their world size.
# Overridable: MODEL_PATH (data/wan_i2v_a14b: Wan-AI/Wan2.2-I2V-A14B-Diffusers, transformer/ and transformer_2/
# with model_index.json's boundary_ratio 0.9, no image encoder), DATA_JSON, OUTPUT_DIR, REWARDS, TRAIN_EXPERTS,
# ROLLOUT_BATCH_SIZE.
# Each value's source (FF = Flow-Factory's yaml):
#   --model_family wan_i2v     FF model_type: "wan2_i2v" (WanImageToVideoPipeline: the first frame's VAE condition;
#                              this folder has no CLIP)
#   --train_experts high       FF model.target_components: 'transformer' (the high-noise expert; its yaml names
#                              ['transformer', 'transformer_2'] for both: TRAIN_EXPERTS=high,low)
#   --fsdp_version 2           FF config_file: config/accelerate_configs/fsdp2.yaml (its FSDP1 cannot wrap the two
#                              experts; here both versions shard both: docs/wan.md)
#   --h 256 --w 256 --num_frames 5   FF train.resolution: 256, num_frames: 5 (the source images are the clips'
#                              first frames, preprocessed at 256x256)
#   --sampling_steps 8         FF train.num_inference_steps: 8
#   --guidance_scale 3.5       FF train.guidance_scale: 3.5 (one scale: WanImageToVideoPipeline's guidance_scale_2
#                              defaults to it)
#   --flow_grpo_sampling --eta 0.9   FF scheduler.dynamics_type: "Flow-SDE", noise_level: 0.9
#   --sde_steps 1 --sde_start random --sde_window_range 1,2
#                              FF scheduler.num_sde_steps: 1, sde_steps: [1] (transition 1 is the SDE and trained
#                              step), ODE elsewhere
#   --shift 5 --no_quantize_timestep   FF has no flow_shift for it: the folder's scheduler_config.json flow_shift
#                              5.0 (the Wan2.2 repository's wan/configs/wan_i2v_A14B.py sample_shift 5.0, as
#                              make_tiny_wan's i2v_a14b folder), the pipeline's timesteps
#   --num_generations 16 --use_group   FF train.group_size: 16, global_std: false (per-group std)
#   --clip_range 1e-4 --adv_clip_max 5.0   FF train.clip_range: 1.0e-4, adv_clip_range: 5.0; kl_beta: 0 (no KL)
#   --learning_rate 1e-4 --weight_decay 1e-4 --max_grad_norm 1.0   FF optimizers[0]: learning_rate, weight_decay,
#                              max_grad_norm
#   --rewards pickscore:1.0    FF rewards: PickScore, on every frame here (--video_reward_frames all)
#   --mixed_precision bf16 --gradient_checkpointing --seed 42   FF mixed_precision: "bf16",
#                              enable_gradient_checkpointing: true, train.seed: 42
#   batch                      FF unique_sample_num_per_epoch: 48 prompts x 16 an iteration, per_device_batch_size 1,
#                              gradient_step_per_epoch: 2: 48 / world size prompts a rank (PROMPTS_PER_RANK),
#                              micro-batches of 1 accumulated to half a rank's samples (ACCUMULATION): 2 optimizer
#                              steps an iteration
#   --checkpointing_steps 20   FF log.save_freq: 20
# Not reproduced: FF's EMA (decay 0.9 every 4 epochs), its evaluation (480 px, 28 steps, every 20).
# Chosen here (no source): --rollout_batch_size 4 (memory only), --allow_tf32, --max_train_steps 300.
# The embeddings (umT5 at 512 tokens, the negative "", each 256x256 first frame's condition for 5-frame clips):
#   MODEL_PATH=data/wan_i2v_a14b OUTPUT_DIR=data/rl_embeddings_wan_i2v_a14b NUM_FRAMES=5 PROMPT_FILE=your.jsonl
#   bash scripts/preprocess/preprocess_wan_i2v_rl_embeddings.sh
GRPO_ARGS=(
  --model_family wan_i2v --num_frames 5 --train_experts "${TRAIN_EXPERTS:-high}" --fsdp_version 2
  --h 256 --w 256
  --sampling_steps 8 --guidance_scale 3.5
  --flow_grpo_sampling --eta 0.9 --sde_steps 1 --sde_start random --sde_window_range 1,2
  --shift 5 --no_quantize_timestep
  --num_generations 16 --use_group
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0
  --learning_rate 1e-4 --lr_warmup_steps 0 --weight_decay 0.0001
  --rewards "${REWARDS:-pickscore:1.0}" --video_reward_frames all
  --checkpointing_steps 20 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/wan_i2v_a14b}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_wan_i2v_a14b/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/wan_i2v_a14b_grpo}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 1 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-4}"
  --max_train_steps 300 --dataloader_num_workers 4
)
