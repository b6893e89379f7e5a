"""tests/line_split.py: the files one line's suite leaves to the other's exist, are skipped only on
that line (and not with FLUX_GRPO_ALL_TESTS=1), and none of them is a test whose subject is the
library line itself."""

from __future__ import annotations

import line_split
import pytest


def test_every_listed_file_exists_and_is_listed_once():
    assert line_split.missing() == []
    listed = line_split.LINE_INDEPENDENT + line_split.CURRENT_HOME
    assert len(set(listed)) == len(listed)  # a file in both lists would run on neither line


@pytest.mark.parametrize("line, environ, skipped", [("current", {}, True), ("recipe", {}, False),
                                                    ("current", {"FLUX_GRPO_ALL_TESTS": "1"}, False)])
def test_a_listed_file_is_skipped_on_the_current_line_only(line, environ, skipped):
    listed = line_split.LINE_INDEPENDENT[0]
    assert line_split.skipped_here(listed, line, environ) is skipped
    assert not line_split.skipped_here("models/test_flux.py", line, environ)


@pytest.mark.parametrize("line, environ, skipped", [("current", {}, False), ("recipe", {}, True),
                                                    ("recipe", {"FLUX_GRPO_ALL_TESTS": "1"}, False)])
def test_a_current_home_file_is_skipped_on_the_recipe_line_only(line, environ, skipped):
    listed = line_split.CURRENT_HOME[0]
    assert line_split.skipped_here(listed, line, environ) is skipped
    assert (line_split.skip_reason(listed, line, environ) == line_split.REASON_RECIPE) is skipped


# What marks a file as being about the library line: it asks which line it runs on, reads the
# current line's helpers, compares against the stock pipelines or a package's own implementation.
LINE_WORDS = ("line_reason", "library_line", "require_line", "current_line_helpers", "is_current",
              "from diffusers import", "import diffusers", "peft", "Pipeline", "transformers")


@pytest.mark.parametrize("relpath", line_split.LINE_INDEPENDENT + line_split.CURRENT_HOME)
def test_no_listed_file_is_about_the_library_line(relpath):
    text = (line_split.TESTS / relpath).read_text(encoding="utf-8")
    found = [w for w in LINE_WORDS if w in text]
    assert not found and not relpath.startswith(("models/", "install/")), (relpath, found)
