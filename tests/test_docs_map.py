"""docs/architecture.md is the map: it names every registered model family and objective, and the
README's opening names every family."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_architecture_page_and_the_readme_name_every_family_objective_and_reward():
    from fastvideo.algorithms import registry
    from fastvideo.models.catalog import FAMILIES

    registry._builtin()

    page = (ROOT / "docs" / "architecture.md").read_text()
    opening = (ROOT / "README.md").read_text().split("## Quick start")[0]
    families = [w.name for w in FAMILIES]
    assert len(families) == 11
    assert [f for f in families if f"`{f}`" not in page] == []
    assert [f for f in families if f"`{f}`" not in opening] == []
    assert {"grpo", "nft"} <= set(registry._REGISTRY)  # the built-ins (other tests may register plugins)
    assert [o for o in ("grpo", "nft") if f"--algorithm {o}" not in page and o.upper() not in page] == []
