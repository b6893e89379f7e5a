# The run both HunyuanVideo GRPO launchers share: sourced by finetune_hunyuan_video_grpo_{8gpus,a3_16die}.sh
# after they set PROMPTS_PER_RANK and ACCUMULATION (for their world size) and NPROC_DEFAULT. On either library
# line (LINE as scripts/common.sh resolves it). DRY_RUN=1 prints the torchrun command. Overridable: NPROC,
# MASTER_PORT (19004), EXTRA_ARGS, WANDB_DISABLED (true), and hunyuan_video_grpo_args.sh's variables.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
source scripts/finetune/hunyuan_video_grpo_args.sh
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="${NPROC:-$NPROC_DEFAULT}" --master_port="${MASTER_PORT:-19004}" \
  fastvideo/train_grpo_flux.py "${HUNYUAN_VIDEO_GRPO_ARGS[@]}" "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
