# The run the current-line families' GRPO launchers share (FLUX.2, Z-Image, Qwen-Image, Wan): sourced by
# finetune_<family>_grpo_{8gpus,a3_16die}.sh after they set ARGS_FILE (the family's flags and their
# sources, which defines GRPO_ARGS), PROMPTS_PER_RANK and ACCUMULATION (for their world size) and
# NPROC_DEFAULT. On the current library line (LINE=current: .venv-current, bash env_setup.sh
# --line current). DRY_RUN=1 prints the torchrun command. Overridable: NPROC, MASTER_PORT (19003),
# EXTRA_ARGS, WANDB_DISABLED (true), and the variables the args file names.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export LINE=${LINE:-current}
source scripts/common.sh
export WANDB_DISABLED=${WANDB_DISABLED:-true}
# shellcheck disable=SC1090
source "$ARGS_FILE"
# shellcheck disable=SC2086
fg_run --nnodes=1 --nproc_per_node="${NPROC:-$NPROC_DEFAULT}" --master_port="${MASTER_PORT:-19003}" \
  fastvideo/train_grpo_flux.py "${GRPO_ARGS[@]}" "${LEAN_ARGS[@]}" ${EXTRA_ARGS:-}
