# DanceGRPO's GRPO configuration for HunyuanVideo (github.com/XueZeyue/DanceGRPO at 15cc71d:
# scripts/finetune/finetune_hunyuan_grpo.sh running fastvideo/train_grpo_hunyuan.py), as this trainer's flags,
# on either library line. Sourced by finetune_hunyuan_video_grpo_8gpus.sh and
# finetune_hunyuan_video_grpo_a3_16die.sh, which set PROMPTS_PER_RANK and ACCUMULATION for their world size.
# Overridable: MODEL_PATH (data/hunyuan_video: hunyuanvideo-community/HunyuanVideo), DATA_JSON, OUTPUT_DIR,
# REWARDS, ROLLOUT_BATCH_SIZE (1), NUM_FRAMES (53).
# Each value's source (DG = DanceGRPO's launcher; DGT = its train_grpo_hunyuan.py):
#   --num_frames 53           DG --t 53 (14 latent frames: DGT latent_t = (t - 1) // 4 + 1)
#   --h/--w 480               DG --h 480 --w 480
#   --sampling_steps 16       DG --sampling_steps 16
#   --eta 0.25, DanceGRPO's SDE  DG --eta 0.25 and DGT flux_step
#   --shift 5                 DG --shift 5 (DGT sd3_time_shift of linspace(1, 0, 17))
#   quantized timesteps       DGT int(sigma * 1000) (the rollout's default; the pipeline passes 1000 sigma)
#   --guidance_scale 6.0      DGT guidance=torch.tensor([6018.0], dtype=bfloat16) = 6016 in bf16, which is the
#                             pipeline's 6.0 x 1000 in bf16 (the embedded guidance; DG --cfg 0.0: no CFG)
#   --num_generations 24      DG --num_generations 24
#   --use_group --init_same_noise --timestep_fraction 0.6
#                             DG --use_group --use_same_noise --timestep_fraction 0.6
#   --clip_range 1e-4 --adv_clip_max 5   DGT clip_range = 1e-4, adv_clip_max = 5.0
#   --learning_rate 1e-5 --lr_warmup_steps 0   DG the same
#   --weight_decay 1e-4 --max_grad_norm 1.0    DG --weight_decay 0.0001 --max_grad_norm 1.0
#   --seed 42 --sampler_seed 1237 --checkpointing_steps 50 --max_train_steps 202   DG the same
#   --mixed_precision bf16 --allow_tf32 --gradient_checkpointing   DG the same
#   --bestofn 8               DG --bestofn 8 (DGT train_one_step: advantages over all 24 clips of a prompt, then the
#                             4 lowest- and 4 highest-advantage clips train; fastvideo/grpo/bestofn.py)
#   batch                     DG 32 GPUs (4 nodes x 8) x 1 prompt x 24 clips (8 trained): 32 prompts per iteration;
#                             here 4 prompts a rank on 8 devices, 2 on 16 (PROMPTS_PER_RANK), micro-batches of 1
#                             trained clip accumulated so that an iteration makes DG's 2 optimizer steps
#                             (ACCUMULATION: DG --gradient_accumulation_steps 4 of its 8 trained clips a GPU)
# Not reproduced: DG shuffles the 8 kept clips before its micro-batches (torch.randperm); here they train in
# rollout order; DG --use_videoalign with --vq_coef 1.0 --mq_coef 0.0 (VideoAlign's visual quality: issue #48 item 5; REWARDS'
# default HPSv2.1 on every 4th frame stands in, as the Wan2.2 launcher's); DG saves its rollouts at 8 fps.
# Chosen here (no source): --rollout_batch_size 1 (memory only).
# The embeddings: bash scripts/preprocess/preprocess_hunyuan_video_rl_embeddings.sh (Llama 256 tokens + CLIP).
HUNYUAN_VIDEO_GRPO_ARGS=(
  --model_family hunyuan_video --num_frames "${NUM_FRAMES:-53}"
  --h 480 --w 480
  --sampling_steps 16 --eta 0.25 --shift 5 --guidance_scale 6.0
  --num_generations 24 --bestofn 8 --use_group --init_same_noise --timestep_fraction 0.6
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0 --weight_decay 0.0001
  --learning_rate 1e-5 --lr_warmup_steps 0
  --rewards "${REWARDS:-hpsv2:1.0}" --video_reward_frames every:4
  --checkpointing_steps 50 --seed 42 --sampler_seed 1237 --mixed_precision bf16 --allow_tf32
  --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/hunyuan_video}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_hunyuan_video/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/hunyuan_video_grpo}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 1 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-1}"
  --max_train_steps 202 --dataloader_num_workers 4
)
