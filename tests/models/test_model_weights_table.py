"""README's model table ("Real weights") says which repositories are gated, and the folder errors say the
same (fastvideo/models/parts.py GATED_MODEL_REPOS): a user told "gated" by one and not the other loses a
download to a 401."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastvideo.models import parts

README = Path(__file__).resolve().parents[2] / "README.md"
REPO = re.compile(r"\b[\w.-]+/[\w.-]+\b")


def _model_rows() -> list[list[str]]:
    lines = README.read_text().splitlines()
    start = lines.index("| what | where | from | gated (licence) |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_readme_gated_column_matches_the_folder_errors():
    rows = _model_rows()
    assert len(rows) >= 9
    for what, _, source, gated in rows:
        repo = REPO.search(source).group(0)  # the row's first repository
        assert gated.split()[0] == ("yes" if repo in parts.GATED_MODEL_REPOS else "no"), (what, repo, gated)
    listed = {REPO.search(row[2]).group(0) for row in rows}
    # every gated repository the code knows is one a row names (the klein 9B ones in the klein row's words)
    for repo in parts.GATED_MODEL_REPOS:
        assert repo in listed or repo.endswith("-9B"), repo


@pytest.mark.parametrize("repo,gated", [("black-forest-labs/FLUX.1-dev", True), ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", False)])
def test_download_hint_quotes_the_command_and_the_gate(repo, gated):
    hint = parts.download_hint("X", repo, "fam")
    assert f"`huggingface-cli download {repo} --local-dir data/fam`" in hint
    assert "make_tiny_fam data/fam" in hint
    assert ("is gated" in hint and "huggingface-cli login" in hint) == gated
