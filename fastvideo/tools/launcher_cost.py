"""What a launcher's run costs: its training flags (DRY_RUN=1's torchrun command) fed to the cost
model's memory report, with the traffic of the launcher's options against today's defaults.

    python -m fastvideo.tools.launcher_cost [--device_memory_gb 64] [--device npu] LAUNCHER...

One line per launcher: ranks, the lean choice (rollout weights, timesteps per update forward), the
FSDP bytes per rank per iteration with its options and with the defaults (fp32 gathers, sharded
rollout, one timestep per forward), their ratio and the memory verdict. A launcher with --sp_size
above 1 is not priced (the memory model has no sequence parallelism).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from fastvideo import devices

ROOT = Path(__file__).resolve().parents[2]
# The words of the torchrun command before the training script (fastvideo.launch's own flags).
_SCRIPT_SUFFIX = ".py"


def device_probe(env: dict) -> str:
    """scripts/common.sh's FASTVIDEO_DEVICE_PROBE for a launcher run with ``env``, answered by this
    process (torch is imported here already) when the launcher's PYTHON is this interpreter and its
    FASTVIDEO_DEVICE is usable here; "" (the launcher asks torch itself) otherwise."""
    forced = env.get("FASTVIDEO_DEVICE", "")
    if env.get("PYTHON") != sys.executable or forced not in devices.DEVICE_TYPES:
        return ""
    return "" if devices.device_type_problem(forced) else f"{sys.executable}|{forced}|{forced}"


def launcher_args(launcher: str, env: dict | None = None) -> tuple[int, list[str]]:
    """(ranks, the training flags) of ``launcher``'s DRY_RUN=1 command (rewards left as written)."""
    env = dict(os.environ if env is None else env, DRY_RUN="1")
    env.setdefault("FASTVIDEO_DEVICE", "cpu")
    env.setdefault("FASTVIDEO_DEVICE_PROBE", device_probe(env))
    out = subprocess.run(["bash", launcher], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    words = shlex.split(out.strip().splitlines()[-1])
    script = next(i for i, w in enumerate(words) if w.endswith(_SCRIPT_SUFFIX) and "/" in w and i > 2)
    ranks = next(int(w.split("=", 1)[1]) for w in words[:script] if w.startswith("--nproc_per_node="))
    flags = words[script + 1:]
    if words[script].endswith("_lora.py") and "--use_lora" not in flags:  # the LoRA entry point implies it
        flags.insert(0, "--use_lora")
    return ranks, flags


def price(launcher: str, device_memory_gb: float = 64.0, device: str | None = None, env: dict | None = None) -> dict:
    """The cost model's --memory --json report for the launcher's flags (None fields where SP > 1)."""
    import contextlib
    import io

    from fastvideo.tools.cost_model import main

    ranks, flags = launcher_args(launcher, env)
    if "--sp_size" in flags and flags[flags.index("--sp_size") + 1] != "1":
        return {"launcher": launcher, "ranks": ranks, "skipped": "sequence parallel (not in the memory model)"}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        main(["--memory", "--json", "--world_size", str(ranks), "--device", device or devices.NPU,
              "--device_memory_gb", str(device_memory_gb), *flags])
    report = json.loads(buf.getvalue())
    chosen, default = report["fsdp_traffic_chosen_bytes"], report["fsdp_traffic_default_bytes"]
    return {"launcher": launcher, "ranks": ranks, "lean": report["lean"], "peak_bytes": report["peak_bytes"],
            "verdict": report["verdict"], "chosen_bytes": chosen["total"], "default_bytes": default["total"],
            "ratio": default["total"] / chosen["total"] if chosen["total"] else float("inf"),
            "gather_dtype": "bf16" if "--fsdp_param_dtype" in flags and
            flags[flags.index("--fsdp_param_dtype") + 1] == "bf16" else "fp32"}


def format_row(r: dict) -> str:
    name = Path(r["launcher"]).name
    if "skipped" in r:
        return f"{name:<48}{r['ranks']:>4}  not priced: {r['skipped']}"
    lean = r["lean"]
    return (f"{name:<48}{r['ranks']:>4}  {r['gather_dtype']:<5}"
            f"{'gathered' if lean['rollout_gathered'] else 'sharded':<10}{lean['timesteps_per_forward']:>3}"
            f"{r['chosen_bytes'] / 1e9:>10.0f}{r['default_bytes'] / 1e9:>10.0f}{r['ratio']:>7.1f}x"
            f"{r['peak_bytes'] / 1e9:>8.1f}  {r['verdict']}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("launchers", nargs="+")
    ap.add_argument("--device_memory_gb", type=float, default=64.0)
    ap.add_argument("--device", default=devices.NPU, choices=devices.DEVICE_TYPES)
    args = ap.parse_args(argv)
    print(f"{'launcher':<48}{'W':>4}  {'gath':<5}{'rollout':<10}{'K':>3}{'GB lean':>10}{'GB dflt':>10}"
          f"{'ratio':>8}{'peak':>8}  verdict")
    for launcher in args.launchers:
        print(format_row(price(launcher, args.device_memory_gb, args.device)), flush=True)


if __name__ == "__main__":
    main()
