# shellcheck shell=bash
# Ascend NPU runtime environment for the launchers. Source it, do not run it:
#
#   source scripts/npu_env.sh
#
# Every variable keeps a value already set in the environment, so any of them can be overridden:
#   ASCEND_RT_VISIBLE_DEVICES=0,1,2,3 source scripts/npu_env.sh
# CANN's set_env.sh is sourced from CANN_SET_ENV when that is set, otherwise from the first of
# /usr/local/Ascend/cann/set_env.sh and /usr/local/Ascend/ascend-toolkit/set_env.sh that exists;
# when none exists this says so and goes on (CANN may already be in the environment). The file
# sourced is left in CANN_SET_ENV_SOURCED (the launchers print it with DRY_RUN=1).
# Values follow the Ascend recipe for Atlas A3 (16 dies); see docs/npu.md.

# Visible devices, re-indexed from 0 inside the process. CANN reads a comma-separated list and stops
# at the first other character, so "0-15" would mean device 0 alone.
export ASCEND_RT_VISIBLE_DEVICES=${ASCEND_RT_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}
# Two-stage operator dispatch pipeline; workspace-bound tasks move to the second stage.
export TASK_QUEUE_ENABLE=${TASK_QUEUE_ENABLE:-2}
# Make chains of non-contiguous views contiguous in one step.
export COMBINED_ENABLE=${COMBINED_ENABLE:-1}
# Fine-grained binding of host threads to CPU cores.
export CPU_AFFINITY_CONF=${CPU_AFFINITY_CONF:-2}
# HCCL link-setup timeout in seconds; multi-node jobs need it large.
export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-1200}
# HCCL buffer per communicator, in MB.
export HCCL_BUFFSIZE=${HCCL_BUFFSIZE:-800}
# HCCL_BUFFSIZE costs device memory: each communicator takes 2 x HCCL_BUFFSIZE MB.
# Not set here: NPU_ASD_ENABLE applies only to torch_npu 7.0.0 and earlier (this stack is 7.2.0).
# Asynchronous kernel launches (set 1 only to debug: it serialises everything).
export ASCEND_LAUNCH_BLOCKING=${ASCEND_LAUNCH_BLOCKING:-0}
# Host-side operator cache entries.
export ACLNN_CACHE_LIMIT=${ACLNN_CACHE_LIMIT:-100000}
# Not set here: MULTI_STREAM_MEMORY_REUSE=2 is documented as "not currently recommended"; torch_npu
# 2.7.1 defaults to 1 (Ascend/pytorch v7.2.0-pytorch2.7.1 torch_npu/csrc/core/npu/register/OptionsManager.cpp).
# Growable memory segments: less fragmentation.
export PYTORCH_NPU_ALLOC_CONF=${PYTORCH_NPU_ALLOC_CONF:-expandable_segments:True}
export WANDB_DISABLED=${WANDB_DISABLED:-true}

_npu_env_source_cann() {
    local candidates=() f
    if [ -n "${CANN_SET_ENV:-}" ]; then
        candidates=("${CANN_SET_ENV}")
    else
        candidates=(/usr/local/Ascend/cann/set_env.sh /usr/local/Ascend/ascend-toolkit/set_env.sh)
    fi
    for f in "${candidates[@]}"; do
        if [ -f "$f" ]; then
            # set_env.sh reads unset variables such as LD_LIBRARY_PATH: lift `set -u` around it
            # when the caller uses it, and restore it afterwards.
            local had_nounset=0
            case $- in *u*) had_nounset=1; set +u ;; esac
            # shellcheck disable=SC1090
            source "$f"
            if [ "$had_nounset" -eq 1 ]; then set -u; fi
            echo "npu_env: sourced CANN environment from $f" >&2
            export CANN_SET_ENV_SOURCED="$f"
            return 0
        fi
    done
    echo "npu_env: CANN set_env.sh not found (tried: ${candidates[*]}); skipping it." \
        "Set CANN_SET_ENV=/path/to/set_env.sh if CANN is installed elsewhere." >&2
    return 0
}
_npu_env_source_cann
unset -f _npu_env_source_cann
