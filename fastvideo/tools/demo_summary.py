"""The CPU demo's closing lines (scripts/demo/grpo_tiny_cpu.sh): the mean reward of the first and
the last fifth of a run's iterations, named by what the run's rewards measure, where to look (a video
family's run: its sample clips, MP4s in images/, and the evaluation grid's frame strips), and whether
the run published a best checkpoint (best/) or why not.

    python -m fastvideo.tools.demo_summary OUTPUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def reward_label(spec: list[str]) -> str:
    """What the run's --rewards entries (config.json's reward.spec) measure, for a reader."""
    names = [entry.split(":")[0] for entry in spec]
    return "minus JPEG kB" if names == ["compressibility"] else ", ".join(spec)


def summary(output_dir: str | Path) -> list[str]:
    out = Path(output_dir)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    k = max(1, len(rows) // 5)
    first = sum(r["reward_mean"] for r in rows[:k]) / k
    last = sum(r["reward_mean"] for r in rows[-k:]) / k
    spec = json.loads((out / "config.json").read_text())["reward"]["spec"]
    seconds = sum(r["time_iteration"] for r in rows)
    clips = any((out / "images").glob("*/*.mp4"))
    samples = "images/ (the sample clips as MP4; their group grids and eval_grid.png as frame strips)" if clips \
        else "images/"
    lines = [f"demo: reward ({reward_label(spec)}) first {k} iterations {first:.3f} -> last {k} iterations "
             f"{last:.3f} ({'rose' if last > first else 'did not rise'}); {len(rows)} iterations, {seconds:.0f} s",
             f"demo: see {out}/reward_curve.png, eval_grid.png, eval_curve.png and {samples}"]
    return lines + best_line(out)


def best_line(out: Path) -> list[str]:
    """The best checkpoint (training/run/guard.py): best/ holds the trained evaluation that beat the
    base model's held-out score without the reward-hacking guard flagging it; a run with none has no
    best/, and this says which of the two held each evaluation back."""
    best = out / "best" / "BEST.json"
    if best.is_file():
        return [f"demo: best checkpoint {out}/best (iteration {json.loads(best.read_text())['iteration']})"]
    path = out / "eval.jsonl"
    evals = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    base = next((e["trained_score"] for e in evals if e["iteration"] == 0), None)
    trained = [e for e in evals if e["iteration"] >= 1]
    if base is None or not trained:
        return ["demo: no best/ (no held-out evaluation after the base model's)"]
    flagged = sum(bool(e.get("guard", {}).get("hacking")) for e in trained)
    below = sum(e["trained_score"] < base for e in trained if not e.get("guard", {}).get("hacking"))
    return [f"demo: no best/: of {len(trained)} held-out evaluations, {flagged} flagged by the reward-hacking guard "
            f"and {below} below the base model's {base:.3f} (best/ takes only one that is neither)"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m fastvideo.tools.demo_summary OUTPUT_DIR\n")
        return 2
    print("\n".join(summary(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
