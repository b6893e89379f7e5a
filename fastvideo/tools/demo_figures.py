"""Every figure the README quotes from the CPU demos, regenerated on this machine and named by it.

    python -m fastvideo.tools.demo_figures --out docs/demo_figures.md               # every demo
    python -m fastvideo.tools.demo_figures --out FILE --demos flux,nft --steps 40
    python -m fastvideo.tools.demo_figures --out FILE --from_runs DEMO_DIR          # no new runs

Each demo is scripts/demo/grpo_tiny_cpu.sh as a reader runs it (MODEL=..., ALGO=nft for "nft"),
into DEMO_DIR (default data/demo_figures). The table gives, per demo, its library line, the mean
training reward of the first and the last fifth of the iterations, the held-out reward of the base
model (iteration 0) and at the last evaluation, and the training time; its header names the CPU
(model name and the ATen kernels torch chose), torch and the commit. The figures are exact on the
machine that made them: another CPU's matrix kernels round differently from the first iteration on,
and 40 iterations of training carry that further (what holds on every CPU is the direction: the
suite checks the rise over 3 seeds with a margin, tests/training/test_trainer.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# demo name -> the demo script's environment (MODEL, ALGO, LINE), its output folder under DEMO_DIR and
# its library line (the demo runs FLUX.1 and SD3.5 on the recipe line unless LINE=current, every
# other family on the current line)
DEMOS = {
    "flux": ({"MODEL": "flux", "LINE": "recipe"}, "outputs", "recipe"),
    "flux_current": ({"MODEL": "flux", "LINE": "current"}, "outputs_current", "current"),
    "nft": ({"MODEL": "flux", "ALGO": "nft", "LINE": "recipe"}, "outputs_nft", "recipe"),
    "sd3": ({"MODEL": "sd3", "LINE": "recipe"}, "outputs_sd3", "recipe"),
    "flux2": ({"MODEL": "flux2"}, "outputs_flux2", "current"),
    "zimage": ({"MODEL": "zimage"}, "outputs_zimage", "current"),
    "qwen_image": ({"MODEL": "qwen_image"}, "outputs_qwen_image", "current"),
    "kontext": ({"MODEL": "kontext"}, "outputs_kontext", "current"),
    "qwen_image_edit": ({"MODEL": "qwen_image_edit"}, "outputs_qwen_image_edit", "current"),
    "wan": ({"MODEL": "wan"}, "outputs_wan", "current"),
    "hunyuan_video": ({"MODEL": "hunyuan_video", "LINE": "recipe"}, "outputs_hunyuan_video", "recipe"),
}


@dataclass(frozen=True)
class Figures:
    demo: str
    line: str
    iterations: int
    first: float  # mean training reward of the first fifth of the iterations
    last: float  # ... of the last fifth
    heldout_base: float | None  # the held-out reward at iteration 0 (the base model)
    heldout_last: float | None  # ... at the last evaluation
    heldout_iteration: int | None
    seconds: float  # training time (the iterations' time_iteration)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run_figures(demo: str, out: Path) -> Figures:
    """The figures of one finished demo run (its OUTPUT_DIR)."""
    rows = _jsonl(out / "metrics.jsonl")
    if not rows:
        raise ValueError(f"{out}/metrics.jsonl has no iteration")
    k = max(1, len(rows) // 5)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    evals = _jsonl(out / "eval.jsonl") if (out / "eval.jsonl").is_file() else []
    guard = config.get("reward", {}).get("spec", ["?"])[0].split(":")[0]

    def heldout(record):
        rewards = record.get("rewards", {})
        return rewards.get(guard, next(iter(rewards.values()), {})).get("mean")

    base = next((heldout(r) for r in evals if r.get("iteration") == 0), None)
    last = evals[-1] if evals and evals[-1].get("iteration") else None
    return Figures(demo=demo, line=DEMOS[demo][2], iterations=len(rows), first=sum(r["reward_mean"] for r in rows[:k]) / k,
                   last=sum(r["reward_mean"] for r in rows[-k:]) / k, heldout_base=base,
                   heldout_last=heldout(last) if last else None,
                   heldout_iteration=last["iteration"] if last else None,
                   seconds=sum(r.get("time_iteration", 0.0) for r in rows))


def machine() -> str:
    """The CPU's model name, the ATen kernels torch picked on it, torch's version and the commit."""
    import torch

    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return (f"{name}, {os.cpu_count()} cores, ATen kernels {torch.backends.cpu.get_cpu_capability()}, "
            f"torch {torch.__version__}, commit {commit.stdout.strip() or 'unknown'}")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(figures: list[Figures], where: str) -> str:
    lines = [f"Measured on: {where}.", "",
             "| demo | line | iterations | reward, first fifth -> last fifth | held-out, base -> last evaluation "
             "| training s |", "|---|---|---|---|---|---|"]
    for f in figures:
        held = "-" if f.heldout_base is None and f.heldout_last is None else \
            f"{_num(f.heldout_base)} -> {_num(f.heldout_last)} (iteration {f.heldout_iteration})"
        lines.append(f"| {f.demo} | {f.line} | {f.iterations} | {f.first:.3f} -> {f.last:.3f} "
                     f"({f.last - f.first:+.3f}) | {held} | {f.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def run_demo(demo: str, demo_dir: Path, steps: int | None) -> Path:
    """scripts/demo/grpo_tiny_cpu.sh for ``demo`` into ``demo_dir``; its OUTPUT_DIR."""
    env_extra, folder, _ = DEMOS[demo]
    env = dict(os.environ, DEMO_DIR=str(demo_dir), **env_extra, **({"STEPS": str(steps)} if steps else {}))
    print(f"demo_figures: running the {demo} demo into {demo_dir}", flush=True)
    proc = subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], cwd=ROOT, env=env)
    if proc.returncode:
        raise SystemExit(f"demo_figures: the {demo} demo exited {proc.returncode}")
    return demo_dir / folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastvideo.tools.demo_figures", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the markdown file to write (e.g. docs/demo_figures.md)")
    p.add_argument("--demos", default=",".join(DEMOS), help=f"comma-separated, of {', '.join(DEMOS)}")
    p.add_argument("--demo_dir", default="data/demo_figures", help="where the demos run")
    p.add_argument("--steps", type=int, default=None, help="iterations per demo (default: the demo's 40)")
    p.add_argument("--from_runs", default=None, metavar="DEMO_DIR",
                   help="read the demos' finished runs in DEMO_DIR instead of running them")
    args = p.parse_args(argv)
    demos = [d.strip() for d in args.demos.split(",") if d.strip()]
    unknown = [d for d in demos if d not in DEMOS]
    if unknown or not demos:
        p.error(f"--demos: unknown {', '.join(unknown) or '(none given)'}; use some of {', '.join(DEMOS)}")
    figures = []
    for demo in demos:
        out = Path(args.from_runs) / DEMOS[demo][1] if args.from_runs else run_demo(demo, Path(args.demo_dir),
                                                                                    args.steps)
        if not (out / "metrics.jsonl").is_file():
            p.error(f"{out}/metrics.jsonl is missing: run the {demo} demo first (or leave out --from_runs)")
        figures.append(run_figures(demo, out))
    text = table(figures, machine())
    Path(args.out).write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
