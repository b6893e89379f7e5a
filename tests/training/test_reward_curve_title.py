"""The reward curve names the objective that trained (an NFT run's plot was titled "GRPO reward")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.mark.parametrize("algorithm, title", [("grpo", "GRPO reward"), ("nft", "NFT reward"),
                                              ("my_mod:MyObjective", "my_mod:MyObjective reward")])
def test_the_reward_curve_is_titled_by_the_objective(algorithm, title, tmp_path, monkeypatch):
    from fastvideo.training import hooks, metrics

    seen = {}
    monkeypatch.setattr(metrics, "plot_reward_curve", lambda records, out, title: seen.update(title=title, out=out))
    cfg = SimpleNamespace(algorithm=algorithm, output=SimpleNamespace(output_dir=str(tmp_path)))
    trainer = SimpleNamespace(info=SimpleNamespace(is_main=True), cfg=cfg, metrics=SimpleNamespace(read=lambda: []))
    hooks.RewardCurveHook().on_checkpoint(trainer, tmp_path)
    assert seen == {"title": title, "out": Path(tmp_path) / "reward_curve.png"}
