# verl-omni's DanceGRPO configuration for Wan2.2-TI2V-5B (github.com/verl-project/verl-omni at a1139ba:
# examples/dancegrpo_trainer/wan22/run_wan22_5b_t2v_hpsv3_auto.sh, text-to-video, 8 GPUs or 16 Ascend NPU
# dies), as this trainer's flags. Sourced through scripts/finetune/current_line_grpo.sh by
# finetune_wan22_grpo_8gpus.sh and finetune_wan22_grpo_a3_16die.sh, which set PROMPTS_PER_RANK and
# ACCUMULATION for their world size.
# Overridable: MODEL_PATH (data/wan22: Wan-AI/Wan2.2-TI2V-5B-Diffusers), DATA_JSON, OUTPUT_DIR, REWARDS,
# ROLLOUT_BATCH_SIZE (2).
# Each value's source (VO = verl-omni's script; FF = Flow-Factory at a0b2bc5, examples/grpo/full/wan21/t2v.yaml,
# a cross-check):
#   --h 704 --w 1280          VO rollout.pipeline.height=704, width=1280
#   --num_frames 9            VO rollout.pipeline.num_frames=8, which WanPipeline rounds to 4k+1 = 9
#                             (pipeline_wan.py: num_frames // 4 * 4 + 1); here 4k+1 is required
#   --sampling_steps 10       VO rollout.pipeline.num_inference_steps=10 (FF train.num_inference_steps: 10)
#   --guidance_scale 5.0      VO rollout.pipeline.true_cfg_scale=5.0, guidance_scale=5.0 (FF: 5.0)
#   --eta 1.2, DanceGRPO's SDE  VO rollout.algo.noise_level=1.2, sde_type="dance_sde"
#   --sde_steps 2 --sde_start random --sde_window_range 0,5
#                             VO rollout.algo.sde_window_size=2, sde_window_range="[0,5]": a window of 2 SDE (and
#                             trained) steps drawn in transitions 0..4, ODE elsewhere (FF: 1 of [1, 2, 3])
#   --shift 5 --no_quantize_timestep
#                             the Wan2.2-TI2V-5B-Diffusers folder's scheduler flow_shift 5.0, the pipeline's
#                             1000-sigma timesteps (VO samples with the folder's pipeline; FF: "5.0 for 720P")
#   --num_generations 8       VO rollout.n=8 (FF train.group_size: 16)
#   --use_group --global_std  VO algorithm.adv_estimator=dance_grpo (FlowGRPO's estimator) with its trainer config's
#                             norm_adv_by_std_in_grpo: true, global_std: true: each group's centred rewards over
#                             the std of the whole batch
#   --clip_range 1e-4 --adv_clip_max 5 --max_grad_norm 1.0
#                             VO's trainer config (_generated_diffusion_trainer.yaml): actor clip_ratio 0.0001,
#                             adv_clip_max 5.0, optim grad_clip 1.0
#   --learning_rate 1e-5 --weight_decay 1e-4   VO actor.optim.lr=1e-5, weight_decay=0.0001
#   full fine-tuning          VO sets no lora_rank (its trainer config's default 0; the script's title says LoRA)
#   --use_cpu_offload         VO actor.fsdp_config.param_offload=True (its optimizer_offload has no flag here)
#   --rewards hpsv2:1.0 --video_reward_frames every:4
#                             VO reward hpsv3_reward.py compute_score_hpsv3 on every 4th frame (frame_interval 4);
#                             HPSv3 is not built in (serve it: README "remote rewards"), so HPSv2.1 stands in
#   --mixed_precision bf16    VO actor.fsdp_config.model_dtype=bfloat16
#   --seed 42 --max_train_steps 120 --checkpointing_steps 30
#                             VO data.seed=42, rollout.seed=42, trainer.total_training_steps=120, save_freq=30
#   batch                     VO data.train_batch_size=64 prompts an iteration, ppo_mini_batch_size=16 prompts an
#                             optimizer step (4 a iteration), ppo_micro_batch_size_per_gpu=4: 64 / world size
#                             prompts a rank (PROMPTS_PER_RANK), micro-batches of 4 samples accumulated to one
#                             mini-batch (ACCUMULATION)
# Chosen here (no source): --rollout_batch_size 2 (memory only), --gradient_checkpointing, --allow_tf32.
# Not reproduced: VO's umT5 max_sequence_length 1024 (WanPipeline's 512 here), its validation (50 steps, every 30).
# The embeddings (umT5, 512 tokens, the negative ""): MODEL_PATH=data/wan22 OUTPUT_DIR=data/rl_embeddings_wan22
#   bash scripts/preprocess/preprocess_wan_rl_embeddings.sh
GRPO_ARGS=(
  --model_family wan --num_frames 9
  --h 704 --w 1280
  --sampling_steps 10 --guidance_scale 5.0
  --eta 1.2 --sde_steps 2 --sde_start random --sde_window_range 0,5
  --shift 5 --no_quantize_timestep
  --num_generations 8 --use_group --global_std
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0
  --learning_rate 1e-5 --lr_warmup_steps 0 --weight_decay 0.0001
  --rewards "${REWARDS:-hpsv2:1.0}" --video_reward_frames every:4
  --use_cpu_offload
  --checkpointing_steps 30 --seed 42 --mixed_precision bf16 --allow_tf32 --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/wan22}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_wan22/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/wan22_grpo}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 4 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-2}"
  --max_train_steps 120 --dataloader_num_workers 4
)
