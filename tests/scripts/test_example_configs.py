"""examples/configs/*.yaml: one --config file per launcher (scripts/make_example_configs.py), each
read by the trainer's own check with no problem and giving the launcher's values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.yaml"))
LAUNCHERS = sorted((ROOT / "scripts" / "finetune").glob("finetune_*.sh"))


def test_every_launcher_has_its_example():
    assert [c.stem for c in CONFIGS] == [s.stem for s in LAUNCHERS] and len(CONFIGS) > 20


def _tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_example_configs", ROOT / "scripts" / "make_example_configs.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_an_example_config_reads_as_its_launchers_flags_and_equals_its_dry_run(config):
    """Every file: read by the trainer's check with no problem, equal to passing its values as flags, and
    what its launcher's dry run gives now (scripts/make_example_configs.py --check, launcher by launcher; a
    launcher changed without its example fails here)."""
    from fastvideo import preflight
    from fastvideo.library_lines import library_line

    values = yaml.safe_load(config.read_text())
    family = values.get("model_family", "flux")
    if family not in ("flux", "sd3", "hunyuan_video") and library_line() != "current":
        pytest.skip(f"model family {family} runs on the current library line")
    from_file, problems = preflight.parse_all(["--config", str(config)])
    assert problems == []
    argv = []
    for key, value in values.items():
        argv += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    from_flags, problems = preflight.parse_all(argv)
    assert problems == [] and vars(from_file) == {**vars(from_flags), "config": str(config)}
    assert config.read_text() == _tool().render(ROOT / "scripts" / "finetune" / f"{config.stem}.sh")
