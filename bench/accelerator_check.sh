#!/usr/bin/env bash
# One accelerator check for an offline box with one GPU or NPU and its own torch:
#
#   bash bench/accelerator_check.sh WHEELHOUSE OUT
#
# WHEELHOUSE: made on a connected machine for this box, e.g. for CPython 3.12 x86_64 with CUDA torch:
#   bash env_setup.sh --target cuda --download WH --python 3.12 --platform manylinux_2_28_x86_64 \
#        --preinstalled torch==<its version> --preinstalled torchvision==<its version> \
#        --preinstalled numpy==<its version> --preinstalled pillow==<its version>
# (52.5 MB, 42 wheels, measured for torch 2.14.1; 75 MB when only torch and torchvision are there)
# The library line: LINE=recipe (default) or LINE=current, as the wheelhouse was made (env_setup.sh --line).
# Installs the rest from WHEELHOUSE (pip --no-index, into the current Python: no venv), then, within
# about 9 minutes, writes into OUT:
#   install.log            env_setup.sh's output
#   tests.txt              the device-facing tests run with FASTVIDEO_DEVICE set to the accelerator
#   runs/{cpu,acc}         a tiny 2-iteration CPU run and the same run on the accelerator, sharing their
#                          random draws (--dump_randomness / --load_randomness), recorded
#   alignment/report.md    compare_runs' report of the pair (summary.json, plots), verdict in summary.txt
#   first_ratio_dev.txt    the first update's max |ratio - 1| on the accelerator (0 up to rounding: the
#                          policy has not moved yet, so any deviation is rollout/update mismatch)
#   options.txt / .json    bench/options_table.py: the tiny model's seconds per iteration, MFU and
#                          host-sync count (in the step loops and in total) with each hot-loop option
#                          on and off (--adamw_kernel, bf16 autocast; FSDP options need 2 ranks)
#   gpu_flux_full.txt      bench/gpu_flux_full.py: FLUX.1-dev size, random weights; seconds per phase,
#                          MFU, peak memory
#   summary.txt            every figure above, one line each
# FASTVIDEO_DEVICE=cpu makes the CPU stand in for the accelerator (the script's own test does that).
set -uo pipefail
if [ $# -ne 2 ]; then sed -n '2,26p' "$0"; exit 2; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELHOUSE="$1"
mkdir -p "$2" && OUT="$(cd "$2" && pwd)"
cd "$ROOT"
PY="$(command -v python || command -v python3)"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }

DEV="${FASTVIDEO_DEVICE:-$("$PY" -c 'from fastvideo.devices import device_type; print(device_type())' 2>/dev/null || echo unknown)}"
case "$DEV" in
  cuda|npu) TARGET="$DEV" ;;
  cpu) TARGET=cpu; note "device: cpu (standing in for the accelerator)" ;;
  *) # fastvideo is not installed yet: ask torch directly.
     DEV="$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')"; TARGET="$DEV" ;;
esac
note "device: $DEV ($("$PY" -c 'import torch; print("torch", torch.__version__)'))"

# 1. install the rest from the wheelhouse (the box's torch stays).
if bash env_setup.sh --target "$TARGET" --no-venv --wheelhouse "$WHEELHOUSE" > "$OUT/install.log" 2>&1; then
  note "install: ok from $WHEELHOUSE ($(elapsed) s)"
else
  note "install: FAILED (see install.log)"; exit 1
fi

# 2. the device-facing tests, on the accelerator.
TESTS=${ACCEL_TESTS:-"tests/test_devices.py tests/models/test_flux.py tests/sampling tests/grpo"}
# shellcheck disable=SC2086
FASTVIDEO_DEVICE="$DEV" timeout 180 "$PY" -m pytest -q -p no:cacheprovider $TESTS > "$OUT/tests.txt" 2>&1
note "tests ($TESTS): rc=$? $(tail -1 "$OUT/tests.txt") ($(elapsed) s)"

# 3. a CPU run and an accelerator run with shared randomness, compared.
WORK="$OUT/work"
mkdir -p "$WORK"
"$PY" -m fastvideo.tools.make_tiny_flux "$WORK/tiny_flux" --preset tiny --seed 0 > "$WORK/make.log" 2>&1
"$PY" - "$WORK" <<'PY' > "$WORK/preprocess.log" 2>&1
import sys
from pathlib import Path
from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess
work = Path(sys.argv[1])
run_preprocess(PreprocessConfig(model_path=str(work / "tiny_flux"), prompt_file="assets/prompts_tiny.txt",
                                output_dir=str(work / "emb"), max_sequence_length=32, batch_size=8,
                                dataloader_num_workers=0))
PY
# The CPU standing in for the accelerator (the script's own test) runs the same steps at the smallest
# sizes: 32x32 images, 4 sampling steps, one timed iteration per options-table variant. On a GPU or
# NPU the sizes below are what the check measures.
if [ "$DEV" = cpu ]; then PAIR_SIZE=(--h 32 --w 32 --sampling_steps 4); OPTION_ITERATIONS=1
else PAIR_SIZE=(--h 64 --w 64 --sampling_steps 6); OPTION_ITERATIONS=2; fi
run_pair() {  # run_pair NAME DEVICE RANDOMNESS_FLAG
  FASTVIDEO_DEVICE="$2" OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 timeout 150 "$PY" -m torch.distributed.run --standalone \
    --nproc_per_node=1 fastvideo/train_grpo_flux.py --pretrained_model_name_or_path "$WORK/tiny_flux" \
    --data_json_path "$WORK/emb/videos2caption.json" --output_dir "$WORK/$1_out" --rewards compressibility:1.0 \
    "${PAIR_SIZE[@]}" --eta 0.7 --use_group --num_generations 4 --rollout_batch_size 4 \
    --train_micro_batch_size 4 --timestep_fraction 0.6 --ignore_last --learning_rate 1e-3 --max_grad_norm 1.0 \
    --mixed_precision no --max_train_steps 2 --checkpointing_steps 100 --save_images_every 0 \
    --dataloader_num_workers 0 --seed 42 --record_dir "$OUT/runs/$1" "$3" "$OUT/runs/draws" > "$WORK/$1.log" 2>&1
}
run_pair cpu cpu --dump_randomness && run_pair acc "$DEV" --load_randomness
pair_rc=$?
if [ "$pair_rc" = 0 ]; then
  "$PY" -m fastvideo.tools.compare_runs "$OUT/runs/cpu" "$OUT/runs/acc" --out "$OUT/alignment" > "$WORK/compare.log" 2>&1
  rc=$?
  note "alignment cpu vs $DEV: $([ $rc = 0 ] && echo ALIGNED || echo "NOT ALIGNED (rc=$rc)") - report $OUT/alignment/report.md ($(elapsed) s)"
  "$PY" - "$WORK/acc_out/metrics.jsonl" "$OUT/first_ratio_dev.txt" <<'PY'
import json, sys
first = json.loads(open(sys.argv[1]).readline())
open(sys.argv[2], "w").write(f"{first['first_ratio_dev']:.3e}\n")
PY
  note "first update max |ratio - 1| on $DEV: $(cat "$OUT/first_ratio_dev.txt")"
else
  note "run pair: FAILED (rc=$pair_rc; see $WORK/cpu.log and $WORK/acc.log)"
fi

# 3b. the hot-loop options on and off, on the device (bench/options_table.py).
if [ -f "$WORK/emb/videos2caption.json" ]; then
  FASTVIDEO_DEVICE="$DEV" OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 timeout 240 "$PY" bench/options_table.py --iterations "$OPTION_ITERATIONS" \
    --model_dir "$WORK/tiny_flux" --data_json "$WORK/emb/videos2caption.json" --json "$OUT/options.json" \
    > "$OUT/options.txt" 2>&1
  note "options table: rc=$? ($(elapsed) s)"
  grep -A6 "^variant" "$OUT/options.txt" | sed 's/^/    /' | tee -a "$SUMMARY"
else
  note "options table: skipped (no tiny model embeddings)"
fi

# 3c. --compile against eager (regional compilation, the device layer's backend), if time allows.
left=$(( 480 - $(elapsed) ))
if [ "$DEV" = cpu ]; then
  # Inductor on a CPU standing in for the accelerator compiles for minutes and measures the CPU
  # (docs/performance.md has that figure); tests/models/test_compile.py covers the code path.
  note "compile check: skipped on cpu"
elif [ "$left" -gt 200 ]; then
  FASTVIDEO_DEVICE="$DEV" OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 timeout $(( left - 120 )) "$PY" bench/compile_check.py \
    --preset small --size 128 --iterations 2 --json "$OUT/compile.json" > "$OUT/compile.txt" 2>&1
  note "compile check: rc=$? ($(elapsed) s)"
  grep -A3 "^variant" "$OUT/compile.txt" | sed 's/^/    /' | tee -a "$SUMMARY"
else
  note "compile check: skipped, ${left} s left"
fi

# 4. full-size FLUX on the accelerator (tiny config when the CPU stands in), in what time is left.
left=$(( 540 - $(elapsed) ))
if [ "$DEV" = cpu ]; then FLUX_ARGS=(--allow_cpu); else FLUX_ARGS=(--batch-sizes 1 --rollout-steps 3 --update-steps 2 --warmup 1); fi
if [ "$left" -gt 30 ]; then
  FASTVIDEO_DEVICE="$DEV" timeout "$left" "$PY" bench/gpu_flux_full.py "${FLUX_ARGS[@]}" > "$OUT/gpu_flux_full.txt" 2>&1
  note "gpu_flux_full.py ${FLUX_ARGS[*]}: rc=$? ($(elapsed) s)"
  grep -i -E "mfu|peak|s/step|per step|seconds" "$OUT/gpu_flux_full.txt" | head -12 | sed 's/^/    /' | tee -a "$SUMMARY"
else
  note "gpu_flux_full.py: skipped, ${left} s left of the 9-minute budget"
fi
note "total: $(elapsed) s"
