#!/usr/bin/env bash
# GRPO for FLUX.1-dev at 1024x1024 on one Atlas A3 node (16 NPU dies) with Ulysses sequence
# parallelism (docs/parallelism.md): the 16-die recipe (finetune_flux_grpo_a3_16die.sh) with
# --h/--w 1024 and --sp_size SP (default 2: 8 data-parallel ranks x 2; 4096 image tokens + 512
# text, 24 heads: SP 2, 4 or 8 divide both). DRY_RUN=1 prints the torchrun command.
# Overridable: SP (2) and everything the 16-die recipe takes (NPROC, MODEL_PATH, EXTRA_ARGS, ...).
#
# Cost model (python -m fastvideo.tools.cost_model --sp_table --h 1024 --w 1024), per rank, bf16,
# one sample: the transformer's activations with checkpointing 2.71 GiB (sp 1) -> 1.69 (sp 2) ->
# 1.20 (sp 4) in training, 0.44 -> 0.28 -> 0.21 in a rollout forward; each forward sends 2907 MiB
# (sp 2) / 1539 MiB (sp 4) into 115 collectives (57 attention layers x 2 all-to-alls + 1 gather).
# Verdict (cost_model --memory --h 1024 --w 1024 --world_size 16 --rollout_batch_size 4
# --device_memory_gb 64, which models sp 1): peak 27.70 GB (VAE decode; activations 9.53 GB), fits
# 64 GB with 36.3 GB to spare, so FLUX.1-dev at 1024 px does not need SP for memory; SP 2 cuts the
# per-rank token activations to ~0.6x, which buys a larger --rollout_batch_size or
# --update_timesteps_per_forward (or 2048 px), at ~3 GB of all-to-all per forward over HCCS.
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as DanceGRPO's full fine-tuning; EXTRA_ARGS may choose otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SP=${SP:-2} EXTRA_ARGS="--h 1024 --w 1024 ${EXTRA_ARGS:-}" exec bash scripts/finetune/finetune_flux_grpo_a3_16die.sh
