#!/usr/bin/env python3
"""Write examples/configs/NAME.yaml for every launcher scripts/finetune/NAME.sh: the flags its dry
run passes to the trainer, as a flat --config file (flag names as keys, typed as the flags declare).

    python scripts/make_example_configs.py [--check]

Each file reproduces its launcher's configuration without the launcher: `torchrun
--nproc_per_node N fastvideo/train_grpo_flux.py --config examples/configs/NAME.yaml` (the
launcher's torchrun and device settings are not part of it). --check writes nothing and exits 1
when a file differs from what its launcher now gives (tests/scripts/test_example_configs.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "examples" / "configs"
ENTRY_POINTS = ("fastvideo/train_grpo_flux.py", "fastvideo/train_grpo_flux_lora.py")


def launcher_flags(script: Path) -> list[str]:
    """The trainer's argv in the launcher's DRY_RUN command (its last line)."""
    env = {**os.environ, "DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "EXTRA_ARGS": ""}
    proc = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"make_example_configs: {script.name} DRY_RUN=1 failed: {proc.stderr.strip()[-300:]}")
    words = shlex.split(proc.stdout.strip().splitlines()[-1])
    starts = [i for i, w in enumerate(words) if w in ENTRY_POINTS]
    if not starts:
        raise SystemExit(f"make_example_configs: {script.name}'s dry run names no trainer entry point")
    return words[starts[0] + 1:]


def as_values(argv: list[str]) -> dict:
    """argv -> {flag: value} typed by the trainer's parser (a switch: true)."""
    from fastvideo.config import build_parser

    actions = {s: a for a in build_parser(argv)._actions for s in a.option_strings}
    values, i = {}, 0
    while i < len(argv):
        flag = argv[i]
        action = actions.get(flag)
        if action is None:
            raise SystemExit(f"make_example_configs: unknown flag {flag} in a launcher")
        if action.nargs == 0:
            values[flag[2:]] = action.const if action.const is not None else True
            i += 1
            continue
        kind = action.type or str
        values[flag[2:]] = kind(argv[i + 1])
        i += 2
    return values


def render(script: Path) -> str:
    import yaml

    head = (f"# The configuration scripts/finetune/{script.name} runs (its DRY_RUN flags), as a --config file:\n"
            f"#   torchrun --nproc_per_node N fastvideo/train_grpo_flux.py --config examples/configs/{script.stem}.yaml\n"
            "# Regenerate with: python scripts/make_example_configs.py\n")
    return head + yaml.safe_dump(as_values(launcher_flags(script)), sort_keys=False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 on a difference")
    args = p.parse_args(argv)
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for script in sorted((ROOT / "scripts" / "finetune").glob("finetune_*.sh")):
        text, path = render(script), OUT / f"{script.stem}.yaml"
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"make_example_configs: differ from their launchers: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
