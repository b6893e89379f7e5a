"""A torchrun worker that runs several training launch lines one after another in one process
group (tests/training/test_upstream_launch_lines.py): the interpreter, torch, diffusers and the
gloo group start once for all of them instead of once per line.

    torchrun --nproc_per_node=2 tests/training/launch_lines_worker.py RUNS.json TIMES.json

RUNS.json: [{"name": ..., "entry": "train_grpo_flux.py" | "train_grpo_flux_lora.py", "argv": [...]}].
Each line runs through its entry point's own main(argv), as torchrun would run it; only the
process group's teardown at the end of main is held back until the last line. Rank 0 writes
{name: {"wall_s", "cpu_s"}} to TIMES.json after each line (cpu_s: rank 0's own CPU time, which
a loaded machine stretches less than the wall time). A line that fails ends the worker (main exits
the process with its status, as it does under torchrun)."""

from __future__ import annotations

import json
import sys
import time


def main(runs_path: str, times_path: str) -> int:
    from fastvideo import devices, train_grpo_flux, train_grpo_flux_lora

    entries = {"train_grpo_flux.py": train_grpo_flux.main, "train_grpo_flux_lora.py": train_grpo_flux_lora.main}
    runs = json.loads(open(runs_path).read())
    destroy, times = devices.destroy_distributed, {}
    devices.destroy_distributed = lambda: None  # the group serves every line; destroyed below
    try:
        for run in runs:
            start, cpu = time.perf_counter(), time.process_time()
            print(f"[launch_lines] {run['name']}: {run['entry']} {' '.join(run['argv'])}", flush=True)
            code = entries[run["entry"]](list(run["argv"]))
            if code:
                print(f"[launch_lines] {run['name']} exited {code}", flush=True)
                return code
            times[run["name"]] = {"wall_s": round(time.perf_counter() - start, 2),
                                  "cpu_s": round(time.process_time() - cpu, 2)}
            if devices.rank() == 0:
                with open(times_path, "w") as f:
                    json.dump(times, f)
    finally:
        devices.destroy_distributed = destroy
    devices.destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
