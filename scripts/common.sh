#!/usr/bin/env bash
# Sourced by every launcher: picks the Python, detects the device, loads the NPU environment on
# Ascend, and (DRY_RUN=1) prints `device: <npu|cuda|cpu>; cann: <set_env.sh sourced, or none>`.
# Overridable: PYTHON, FASTVIDEO_DEVICE (npu|cuda|cpu), NPU_ENV_FILE, CANN_SET_ENV, ASCEND_ROOT.
#
# Order matters on Ascend: with torch-npu installed, `import torch` itself fails until CANN's
# set_env.sh is sourced (torch_npu 2.7.1 registers a `torch.backends` entry point that torch loads
# at import; Ascend/pytorch v7.2.0-pytorch2.7.1 setup.py). So the device is first guessed WITHOUT
# Python (FASTVIDEO_DEVICE, then npu-smi on PATH or an Ascend install folder), CANN is sourced,
# and only then is the guess confirmed with torch.
_FG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# LINE=recipe|current picks the library line's environment (.venv / .venv-current, env_setup.sh --line).
case "${LINE:-recipe}" in
  recipe) _FG_VENV="$_FG_ROOT/.venv" ;;
  current) _FG_VENV="$_FG_ROOT/.venv-current" ;;
  *) echo "common.sh: LINE must be recipe or current, not '$LINE'" >&2; exit 2 ;;
esac
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$_FG_VENV/bin/python" ]; then PYTHON="$_FG_VENV/bin/python"; else PYTHON=python3; fi
fi
export PYTHON

# fg_guess_device: npu|cuda|cpu from FASTVIDEO_DEVICE, "npu" when Ascend hardware is visible, else
# empty (torch decides between cuda and cpu).
fg_guess_device() {
  if [ -n "${FASTVIDEO_DEVICE:-}" ]; then echo "$FASTVIDEO_DEVICE"
  elif command -v npu-smi >/dev/null 2>&1 || [ -d "${ASCEND_ROOT:-/usr/local/Ascend}" ]; then echo npu
  fi
}

# fg_source_npu_env: the NPU runtime variables and CANN's set_env.sh (sets CANN_SET_ENV_SOURCED).
fg_source_npu_env() {
  [ -n "${_FG_NPU_ENV_DONE:-}" ] && return 0
  _FG_NPU_ENV_DONE=1
  # shellcheck disable=SC1090
  source "${NPU_ENV_FILE:-$_FG_ROOT/scripts/npu_env.sh}"
}

# fg_confirm_device GUESS: the device torch sees (fastvideo.devices.device_type), or exit 1 with
# the fix when torch cannot be imported or disagrees with the hardware.
# FASTVIDEO_DEVICE_PROBE="PYTHON|GUESS|DEVICE" (exported once confirmed): the answer for this Python
# and guess, so a launcher that execs another, or a tool that runs many dry runs
# (fastvideo.tools.launcher_cost, tests/scripts), imports torch for it once; another PYTHON or guess asks again.
fg_confirm_device() {
  local guess=$1 err out probe=${FASTVIDEO_DEVICE_PROBE:-}
  if [ -n "$probe" ] && [ "${probe%|*}" = "$PYTHON|$guess" ]; then echo "${probe##*|}"; return 0; fi
  err=$(mktemp)
  if ! out=$(cd "$_FG_ROOT" && "$PYTHON" -c "from fastvideo.devices import device_type; print(device_type())" 2>"$err"); then
    if grep -q "Failed to load the backend extension: torch_npu" "$err"; then
      echo "common.sh: 'import torch' fails: torch-npu is installed but CANN's environment is not loaded" \
        "(cann: ${CANN_SET_ENV_SOURCED:-none})." >&2
      echo "  On an Ascend machine: source CANN's set_env.sh first, or set CANN_SET_ENV=/path/to/set_env.sh." >&2
      echo "  On a machine without an NPU: $PYTHON -m pip uninstall torch-npu" >&2
    elif [ "${DRY_RUN:-0}" = 1 ] && [ -n "$_FG_REQUESTED" ]; then
      rm -f "$err"; echo "$guess"; return 3  # a dry run previews a device this machine lacks
    else
      echo "common.sh: device detection failed ($PYTHON):" >&2
      tail -n 5 "$err" >&2
    fi
    rm -f "$err"
    exit 1
  fi
  rm -f "$err"
  if [ "$guess" = npu ] && [ "$out" != npu ] && [ "${DRY_RUN:-0}" = 1 ] && [ -n "$_FG_REQUESTED" ]; then
    echo npu; return 3
  fi
  if [ "$guess" = npu ] && [ "$out" != npu ]; then
    echo "common.sh: Ascend hardware found (npu-smi or ${ASCEND_ROOT:-/usr/local/Ascend}) but torch sees '$out':" \
      "install the NPU stack (bash env_setup.sh --target npu) with CANN sourced, or set FASTVIDEO_DEVICE=$out" >&2
    exit 1
  fi
  echo "$out"
}

CANN_SET_ENV_SOURCED=${CANN_SET_ENV_SOURCED:-}
_FG_REQUESTED=${FASTVIDEO_DEVICE:-}  # asked for by name (a dry run may preview it without the device)
_FG_GUESS=$(fg_guess_device)
# A run forced onto the CPU does not need torch-npu: keep torch from auto-loading it (which fails
# without CANN) so the CPU demo and tests also work on an Ascend machine.
if [ "$_FG_GUESS" = cpu ]; then export TORCH_DEVICE_BACKEND_AUTOLOAD=${TORCH_DEVICE_BACKEND_AUTOLOAD:-0}; fi
if [ "$_FG_GUESS" = npu ]; then fg_source_npu_env; fi
# fg_confirm_device returns 3 in a dry run for a device asked for by FASTVIDEO_DEVICE that torch
# cannot confirm here (an NPU command previewed on a login node without one): kept as requested
# and said so in the device line. Hardware found without a working stack still stops with the fix.
_FG_UNCONFIRMED=""
_FG_RC=0
FASTVIDEO_DEVICE=$(fg_confirm_device "$_FG_GUESS") || _FG_RC=$?
if [ "$_FG_RC" = 3 ]; then _FG_UNCONFIRMED=1; elif [ "$_FG_RC" != 0 ]; then exit 1; fi
export FASTVIDEO_DEVICE
if [ "$_FG_RC" = 0 ]; then export FASTVIDEO_DEVICE_PROBE="$PYTHON|$_FG_GUESS|$FASTVIDEO_DEVICE"; fi
# torch found an NPU that the hardware probe missed (CANN loaded by hand, unusual install path).
if [ "$FASTVIDEO_DEVICE" = npu ]; then fg_source_npu_env; fi
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
if [ "${DRY_RUN:-0}" = 1 ]; then
  # The library line this environment runs (fastvideo.library_lines; no torch import).
  _FG_LINE=$(cd "$_FG_ROOT" && "$PYTHON" -c "from fastvideo.library_lines import line_summary; print(line_summary())" 2>/dev/null || echo unknown)
  echo "device: $FASTVIDEO_DEVICE${_FG_UNCONFIRMED:+ (not confirmed: torch sees no $FASTVIDEO_DEVICE on this machine)}; cann: ${CANN_SET_ENV_SOURCED:-none}; line: $_FG_LINE"
fi
# torchrun (from the same environment as PYTHON) behind fastvideo.launch: the configuration check
# runs once before any worker starts (every problem one line, exit 2; FASTVIDEO_PREFLIGHT=0 skips
# it), a user error inside the ranks is printed once instead of once per rank (exit 2, no torchrun
# traceback), SIGTERM / SIGINT stop the run at a checkpoint (exit 0 / 130).
TORCHRUN=("$PYTHON" -m fastvideo.launch)

# fg_rewards FLAG...: set REWARD_ARGS to the launcher's reward flags, or, with REWARDS=SPEC, to
# `--rewards SPEC` instead (e.g. REWARDS=compressibility:1.0: a smoke test that needs no reward weights;
# README "Smoke-test a launcher on CPU").
fg_rewards() {
  if [ -n "${REWARDS:-}" ]; then REWARD_ARGS=(--rewards "$REWARDS"); else REWARD_ARGS=("$@"); fi
}

# LEAN_ARGS: the communication-lean options the multi-device launchers run with (issue #37;
# docs/performance.md "A communication-lean iteration"): FSDP gathers in bf16 (fp32 gradient
# reduction into the fp32 master shards; upstream DanceGRPO gathers in fp32), the rollout's weights
# gathered once where the memory model says they fit (auto, said at start-up), all trained timesteps
# of a micro-batch in one update forward (halved at start-up until it fits). For FLUX.1-dev on 16
# dies: 15.2x fewer FSDP bytes per rank per iteration, peak 39.8 GB of a 64 GB die
# (python -m fastvideo.tools.launcher_cost LAUNCHER). LEAN=0: today's defaults (fp32 gathers, a gather
# per forward, one timestep per forward). Not with sequence parallelism (SP > 1): not tested together.
# bf16 gathers need bf16 autocast: left off when EXTRA_ARGS asks for --mixed_precision no.
LEAN_GATHER=(--fsdp_param_dtype bf16)
# and by DDP (--fsdp_sharding_strategy none: no FSDP gathers to make bf16): left off there.
case " ${EXTRA_ARGS:-} " in *" --mixed_precision no "* | *" --mixed_precision=no "*) LEAN_GATHER=() ;; esac
case " ${EXTRA_ARGS:-} " in *" --fsdp_sharding_strategy none "* | *" --fsdp_sharding_strategy=none "* | \
  *" --fsdp_sharding_startegy none "* | *" --fsdp_sharding_startegy=none "*) LEAN_GATHER=() ;; esac
LEAN_ARGS=("${LEAN_GATHER[@]}" --rollout_weights auto --update_timesteps_per_forward all)
if [ "${LEAN:-1}" = 0 ] || [ "${SP:-1}" != 1 ]; then LEAN_ARGS=(); fi

# The reward-weight folders' variables (README "Reward weights", fastvideo/rewards/weights.py): VARIABLE
# FLAG [FLAGS that name the same folder]. The flags' defaults are the README's folders; an exported
# variable becomes its flag unless the command names that folder already (MixGRPO's --hps_path...).
FG_REWARD_DIRS=("HPS_DIR --hps_ckpt_dir --hps_path --hps_clip_path" "PICKSCORE_DIR --pickscore_dir"
                "CLIP_DIR --clip_dir --clip_score_path" "AESTHETIC_DIR --aesthetic_dir"
                "IMAGE_REWARD_DIR --image_reward_dir --image_reward_path --image_reward_med_config"
                "VIDEOALIGN_DIR --videoalign_dir")

# fg_reward_dirs ARGS...: set REWARD_DIR_ARGS to the flags of the exported FG_REWARD_DIRS variables
# that ARGS do not already give.
fg_reward_dirs() {
  REWARD_DIR_ARGS=()
  local entry var value flag given word
  local -a names
  for entry in "${FG_REWARD_DIRS[@]}"; do
    read -r -a names <<< "$entry"
    var=${names[0]}
    value=$(printenv "$var") || continue
    given=0
    for word in "$@"; do
      for flag in "${names[@]:1}"; do
        if [ "$word" = "$flag" ] || [ "${word%%=*}" = "$flag" ]; then given=1; fi
      done
    done
    if [ "$given" = 0 ]; then REWARD_DIR_ARGS+=("${names[1]}" "$value"); fi
  done
}

# fg_run ARGS...: run torchrun with ARGS (and the reward folders of fg_reward_dirs), or with DRY_RUN=1
# print the command (one line) and exit 0.
fg_run() {
  fg_reward_dirs "$@"
  set -- "$@" "${REWARD_DIR_ARGS[@]}"
  if [ "${DRY_RUN:-0}" = 1 ]; then
    printf '%q ' "${TORCHRUN[@]}" "$@"
    printf '\n'
    return 0
  fi
  "${TORCHRUN[@]}" "$@"  # prints "+ torchrun ARGS" once the configuration check passed
}
