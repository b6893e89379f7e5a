"""No shipped launcher passes a flag that the start-up then calls useless (issue #52 item 3: "the
shipped launchers pass flags that then print 'has no effect' in every run"). Each launcher's flags are
its examples/configs/NAME.yaml (its DRY_RUN=1 command: tests/scripts/test_example_configs.py,
scripts/make_example_configs.py --check); through the trainer's own check (fastvideo.config
validate_args) they give no "no effect" note. MixGRPO-Flash and Flash* (FLASH=1 / star, no example
file) are dry-run here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from fastvideo.library_lines import library_line

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.yaml"))


def _noted(argv: list[str]) -> list[str]:
    from fastvideo import preflight
    from fastvideo.config import validate_args

    args, problems = preflight.parse_all(argv)
    assert problems == []
    return [n for n in validate_args(args).compat_notes if "no effect" in n]


def test_no_launcher_flag_is_noted_as_without_effect():
    noted, checked = {}, []
    for config in CONFIGS:
        family = yaml.safe_load(config.read_text()).get("model_family", "flux")
        if family not in ("flux", "sd3") and library_line() != "current":
            continue  # its family runs on the current line (the current-line run checks it)
        noted[config.stem] = _noted(["--config", str(config)])
        checked.append(config.stem)
    assert {k: v for k, v in noted.items() if v} == {}
    assert len(checked) >= (26 if library_line() == "current" else 14), checked


@pytest.mark.parametrize("flash", ["star"])
def test_mixgrpo_flash_launcher_has_no_useless_flag(flash):
    """FLASH=star sets every DPM flag MixGRPO's FLASH=0 launcher leaves out (no DPM tail there)."""
    from fastvideo.tools.launcher_cost import launcher_args

    env = {k: v for k, v in os.environ.items() if k not in ("LEAN", "SP", "EXTRA_ARGS", "NPROC", "REWARDS")}
    _, flags = launcher_args("scripts/finetune/finetune_flux_mixgrpo_8gpus.sh",
                             dict(env, FASTVIDEO_DEVICE="cpu", PYTHON=sys.executable, FLASH=flash))
    assert "--dpm_solver_type" in flags and _noted(flags) == []
