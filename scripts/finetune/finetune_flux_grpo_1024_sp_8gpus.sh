#!/usr/bin/env bash
# GRPO for FLUX.1-dev at 1024x1024 on 8 devices with Ulysses sequence parallelism
# (docs/parallelism.md): upstream's 8-GPU configuration (finetune_flux_grpo_8gpus.sh) with --h/--w
# 1024 and --sp_size SP (default 2: 4 data-parallel ranks x 2). DRY_RUN=1 prints the torchrun
# command. Overridable: SP (2) and everything the 8-GPU launcher takes (NPROC, MODEL_PATH,
# EXTRA_ARGS, ...).
#
# Cost model (python -m fastvideo.tools.cost_model --sp_table --h 1024 --w 1024), per rank, bf16,
# one sample: training activations 2.71 GiB (sp 1) -> 1.69 (sp 2) -> 1.20 (sp 4); 2907 MiB of
# all-to-all per forward at sp 2. Verdict (cost_model --memory --h 1024 --w 1024 --world_size 8
# --device cuda --rollout_batch_size 4 --device_memory_gb 80, sp 1): peak 35.64 GB (update), fits
# 80 GB with 44.4 GB to spare: SP is not needed for memory at 1024 px; it cuts the per-rank token
# activations to ~0.6x (sp 2) for larger rollout batches or sizes.
# Trained weights: every transformer weight (--trainable_modules all) in fp32 masters with fp32 AdamW state
# (--master_weight_type fp32), the defaults, as DanceGRPO's full fine-tuning; EXTRA_ARGS may choose otherwise.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SP=${SP:-2} EXTRA_ARGS="--h 1024 --w 1024 ${EXTRA_ARGS:-}" exec bash scripts/finetune/finetune_flux_grpo_8gpus.sh
