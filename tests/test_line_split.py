"""tests/line_split.py: the files the current line's suite leaves to the recipe line's exist, are
skipped only on the current line (and not with FLUX_GRPO_ALL_TESTS=1), and none of them is a test
whose subject is the library line itself."""

from __future__ import annotations

import line_split
import pytest


def test_every_listed_file_exists_and_is_listed_once():
    assert line_split.missing() == []
    assert len(set(line_split.LINE_INDEPENDENT)) == len(line_split.LINE_INDEPENDENT)


@pytest.mark.parametrize("line, environ, skipped", [("current", {}, True), ("recipe", {}, False),
                                                    ("current", {"FLUX_GRPO_ALL_TESTS": "1"}, False)])
def test_a_listed_file_is_skipped_on_the_current_line_only(line, environ, skipped):
    listed = line_split.LINE_INDEPENDENT[0]
    assert line_split.skipped_here(listed, line, environ) is skipped
    assert not line_split.skipped_here("models/test_flux.py", line, environ)


# What marks a file as being about the library line: it asks which line it runs on, reads the
# current line's helpers, compares against the stock pipelines or a package's own implementation.
LINE_WORDS = ("line_reason", "library_line", "require_line", "current_line_helpers", "is_current",
              "from diffusers import", "import diffusers", "peft", "Pipeline", "transformers")


@pytest.mark.parametrize("relpath", line_split.LINE_INDEPENDENT)
def test_no_listed_file_is_about_the_library_line(relpath):
    text = (line_split.TESTS / relpath).read_text(encoding="utf-8")
    found = [w for w in LINE_WORDS if w in text]
    assert not found and not relpath.startswith(("models/", "install/")), (relpath, found)
