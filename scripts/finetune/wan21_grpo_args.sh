# DanceGRPO's GRPO configuration for Wan2.1-T2V-1.3B (github.com/XueZeyue/DanceGRPO at 15cc71d:
# scripts/finetune/finetune_wan_2_1_grpo.sh running fastvideo/train_grpo_wan_2_1.py), as this trainer's flags:
# Wan trained on single frames with HPSv2.1 ("Wan-as-images"). Sourced through scripts/finetune/current_line_grpo.sh
# by finetune_wan21_grpo_8gpus.sh and finetune_wan21_grpo_a3_16die.sh, which set PROMPTS_PER_RANK and
# ACCUMULATION for their world size.
# Overridable: MODEL_PATH (data/wan: Wan-AI/Wan2.1-T2V-1.3B-Diffusers), DATA_JSON, OUTPUT_DIR, REWARDS,
# ROLLOUT_BATCH_SIZE (4), NUM_FRAMES (1; 4k+1 for clips, e.g. Flow-Factory's 5 below).
# Each value's source (DG = DanceGRPO's script; FF = Flow-Factory at a0b2bc5, examples/grpo/full/wan21/t2v.yaml,
# a cross-check: its Wan2.1 GRPO on 5-frame clips of the 14B):
#   --num_frames 1            DG --t 1 --num_latent_t 1: one frame (FF train.num_frames: 5, resolution 256)
#   --h/--w 512               DG --h 512 --w 512
#   --sampling_steps 20       DG --sampling_steps 20 (FF train.num_inference_steps: 10)
#   --eta 0.3, DanceGRPO's SDE  DG --eta 0.3 and its flux_step (FF: Flow-SDE, noise_level 0.9)
#   --shift 3                 DG --shift 3 (sd3_time_shift of its sigmas; FF scheduler.flow_shift: 3.0 "for 480P")
#   quantized timesteps       DG int(sigma * 1000) (this family's default; WanPipeline passes 1000 sigma)
#   --guidance_scale 5.0      DG --cfg_infer 5.0: the rollout's CFG with the negative prompt's embeddings
#                             (its --cfg 0.0 is unused by the Wan script; FF train.guidance_scale: 5.0)
#   --num_generations 12      DG --num_generations 12 (FF train.group_size: 16)
#   --use_group --init_same_noise --timestep_fraction 0.6
#                             DG --use_group --init_same_noise --timestep_fraction 0.6
#   --clip_range 1e-4 --adv_clip_max 5   DG (and FF train.clip_range 1.0e-4, adv_clip_range 5.0)
#   --learning_rate 1e-5 --lr_warmup_steps 0   DG (FF: 1.0e-4)
#   --weight_decay 1e-4 --max_grad_norm 1.0    DG (and FF adam_weight_decay 1.0e-4, max_grad_norm 1.0)
#   --rewards hpsv2:1.0       DG --use_hpsv2 (HPSv2.1; FF: CLIP 1.0 + PickScore 0.5)
#   --seed 42 --sampler_seed 1223627 --checkpointing_steps 200 --max_train_steps 1000
#                             DG the same
#   --mixed_precision bf16 --allow_tf32 --gradient_checkpointing   DG the same (FF: bf16, checkpointing on)
#   batch                     DG --train_batch_size 2 on 8 GPUs with --gradient_accumulation_steps 24: 2 prompts
#                             x 12 samples a rank, one optimizer step per iteration (a micro-batch of 1 sample,
#                             24 accumulated); 16 prompts per iteration (PROMPTS_PER_RANK, ACCUMULATION)
# Chosen here (no source): --rollout_batch_size 4 (memory only).
# Not reproduced: DG saves its rollouts as MP4 at 24 fps (this family writes Wan2.1's 16, docs/wan.md).
# The embeddings: bash scripts/preprocess/preprocess_wan_rl_embeddings.sh (umT5, 512 tokens, the negative "").
GRPO_ARGS=(
  --model_family wan --num_frames "${NUM_FRAMES:-1}"
  --h 512 --w 512
  --sampling_steps 20 --eta 0.3 --shift 3 --guidance_scale 5.0
  --num_generations 12 --use_group --init_same_noise --timestep_fraction 0.6
  --clip_range 1e-4 --adv_clip_max 5.0 --max_grad_norm 1.0 --weight_decay 0.0001
  --learning_rate 1e-5 --lr_warmup_steps 0
  --rewards "${REWARDS:-hpsv2:1.0}"
  --checkpointing_steps 200 --seed 42 --sampler_seed 1223627 --mixed_precision bf16 --allow_tf32
  --gradient_checkpointing
  --pretrained_model_name_or_path "${MODEL_PATH:-data/wan}"
  --data_json_path "${DATA_JSON:-data/rl_embeddings_wan/videos2caption.json}"
  --output_dir "${OUTPUT_DIR:-data/outputs/wan21_grpo}"
  --train_batch_size "$PROMPTS_PER_RANK" --train_micro_batch_size 1 --gradient_accumulation_steps "$ACCUMULATION"
  --rollout_batch_size "${ROLLOUT_BATCH_SIZE:-4}"
  --max_train_steps 1000 --dataloader_num_workers 4
)
