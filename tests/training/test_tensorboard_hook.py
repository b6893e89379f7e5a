"""--report_to tensorboard (issue #52 item 6): scalars under OUTPUT_DIR/tensorboard through torch's
SummaryWriter, imported only when asked; refused in one line where tensorboard is not installed."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from types import SimpleNamespace

import pytest

from fastvideo.component_settings.outputs import OutputSettings
from fastvideo.errors import ConfigError


def _output_args(*argv):
    parser = argparse.ArgumentParser()
    OutputSettings.add_flags(parser)
    return parser.parse_args(["--output_dir", "out", *argv])


def test_refused_in_one_line_without_tensorboard(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        OutputSettings.from_args(_output_args("--report_to", "tensorboard"))
    assert "pip install tensorboard" in str(err.value) and "\n" not in str(err.value)
    assert OutputSettings.from_args(_output_args("--report_to", "none")).report_to == "none"


def test_hook_writes_the_numeric_metrics_as_scalars(monkeypatch, tmp_path):
    written = {}

    class Writer:
        def __init__(self, log_dir):
            written["log_dir"], written["scalars"], written["closed"] = log_dir, [], False

        def add_scalar(self, key, value, global_step):
            written["scalars"].append((key, value, global_step))

        def flush(self):
            pass

        def close(self):
            written["closed"] = True

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    from fastvideo.training.hooks import TensorBoardHook

    hook = TensorBoardHook(SimpleNamespace(output=SimpleNamespace(output_dir=str(tmp_path))))
    assert written["log_dir"] == str(tmp_path / "tensorboard")
    hook.on_iteration_end(None, SimpleNamespace(record={"reward_mean": -3.5, "loss": 0.25, "iteration": 7,
                                                        "phase": "x", "skipped": True}, iteration=7))
    hook.log({"eval/trained_score": 1.0}, 10)
    hook.on_train_end(None)
    assert written["scalars"] == [("reward_mean", -3.5, 7), ("loss", 0.25, 7), ("iteration", 7, 7),
                                  ("eval/trained_score", 1.0, 10)]
    assert written["closed"]
