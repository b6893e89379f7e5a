"""The CPU demo's closing lines (scripts/demo/grpo_tiny_cpu.sh): the mean reward of the first and
the last fifth of a run's iterations, named by what the run's rewards measure, and where to look (a video
family's run: its sample clips, MP4s in images/, and the evaluation grid's frame strips).

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
    return [f"demo: reward ({reward_label(spec)}) first {k} iterations {first:.3f} -> last {k} iterations "
            f"{last:.3f} ({'rose' if last > first else 'did not rise'}); {len(rows)} iterations, {seconds:.0f} s",
            f"demo: see {out}/reward_curve.png, eval_grid.png, eval_curve.png and {samples}"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m fastvideo.tools.demo_summary OUTPUT_DIR\n")
        return 2
    print("\n".join(summary(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
