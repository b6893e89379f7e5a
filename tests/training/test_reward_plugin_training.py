"""A reward plugin trains with no edit under fastvideo/: ``--rewards my_module:Name:WEIGHT`` names a
reward class of a module written outside the package; the tiny FLUX trains 2 iterations on 2 gloo
ranks with it, the metrics carry its scores, and config.json records the entry so --config and a
resume import the same module."""

from __future__ import annotations

import json

import pytest

from helpers import read_metrics, torchrun, train_args

PLUGIN = '''
import torch
from fastvideo.rewards.base import BatchedReward


class MeanRed(BatchedReward):
    name = "mean_red"

    def _score(self, images, prompts):
        return images[:, 0].float().mean(dim=(1, 2))
'''


@pytest.mark.slow
def test_tiny_flux_trains_with_a_plugin_reward(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch):
    (tmp_path / "plugin_dir").mkdir()
    (tmp_path / "plugin_dir" / "red_reward.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path / "plugin_dir"))  # the forked ranks inherit it
    out = tmp_path / "run"
    proc = torchrun(train_args(tiny_embeddings, tiny_flux_dir, out, rewards="red_reward:MeanRed:2.0",
                               max_train_steps=2, num_generations=4, rollout_batch_size=4, h=32, w=32))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2]
    for r in rows:
        red = r["reward/red_reward:MeanRed_mean"]
        assert 0.0 < red < 1.0  # a mean pixel value of the decoded images
        assert r["reward_mean"] == pytest.approx(2.0 * red, rel=1e-6)
    config = json.loads((out / "config.json").read_text())
    assert config["reward"]["spec"] == ["red_reward:MeanRed:2"]
