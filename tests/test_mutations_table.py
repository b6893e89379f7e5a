"""tests/mutations.tsv keeps pointing at the code: every row's file exists and its original line is
found (at its line number, or as the one line with that text), and the mutation changes the line.
A refactor that moves or rewrites a mutated line must re-point its row (tools/mutate.py)."""

from __future__ import annotations

from pathlib import Path

from tools_loader import load_tool

ROOT = Path(__file__).resolve().parents[1]
mutate = load_tool("mutate")


def test_every_mutation_row_resolves():
    rows = mutate.read_table(str(ROOT / "tests" / "mutations.tsv"))
    assert len(rows) > 200
    assert mutate.unresolved(str(ROOT), rows) == []


def test_a_moved_line_is_found_by_its_text_and_a_missing_one_is_reported(tmp_path):
    (tmp_path / "m.py").write_text("a = 1\nb = 2\n")
    moved = mutate.Row(1, "m.py", 1, "b = 2", "b = 3", [])
    missing = mutate.Row(2, "m.py", 2, "c = 4", "c = 5", [])
    assert mutate.locate(["a = 1", "b = 2", ""], moved) == 1
    assert mutate.unresolved(str(tmp_path), [moved, missing]) == [
        "2: m.py:2: original line not found exactly once: c = 4"]
    assert mutate.parse_rows("2,4-5", 9) == {2, 4, 5}
