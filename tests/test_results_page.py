"""docs/results.md (issue #52 item 5): linked from the README's opening, and each anchor row's figures
are docs/performance.md's (which cites where each published figure comes from), not a second copy
that can drift."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rows(text: str, header: str) -> dict[str, list[str]]:
    lines = text[text.index(header):].splitlines()
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("*", "") for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def test_results_page_is_linked_and_quotes_the_performance_page():
    assert "docs/results.md" in (ROOT / "README.md").read_text().split("## Quick start")[0]
    ours = _rows((ROOT / "docs" / "results.md").read_text(), "| anchor (published)")
    theirs = _rows((ROOT / "docs" / "performance.md").read_text(), "| run | config | devices")
    assert len(ours) == 6 and set(ours) <= set(theirs)
    for name, (_, devices, seconds, tflops, mfu, hfu) in ours.items():
        _, _, t_devices, t_seconds, t_tflops, t_mfu, t_hfu = theirs[name]
        assert (devices, seconds, tflops, mfu, hfu) == (t_devices, t_seconds, t_tflops, t_mfu, t_hfu), name
