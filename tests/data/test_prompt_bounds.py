"""Prompt files and editing JSONL that used to end preprocessing with a traceback or grow it past
3-5 GB (issue #50 item 12, #51 item 2): values nested thousands deep, a lone surrogate escape, a
21 MB line, a path too long for the file system, --source_vae_size 65536. Each is one line naming
the file (and line) through the preprocessing entry point's own main, exit 2, before any model loads."""

from __future__ import annotations

import pytest

from fastvideo.data.prompts import MAX_LINE_CHARS


def _jsonl(tmp_path, line: str):
    path = tmp_path / "prompts.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    return path


CASES = {
    "nested": (lambda t: _jsonl(t, '{"prompt": "a cat", "x": ' + "[" * 20_000 + "]" * 20_000 + "}"),
               "line 1 nests its values too deeply"),
    "surrogate": (lambda t: _jsonl(t, '{"prompt": "a cat \\ud800"}'), "line 1: the \"prompt\" string holds a lone"),
    "long line": (lambda t: (t / "long.txt", (t / "long.txt").write_text("a" * (MAX_LINE_CHARS + 1) + "\n"))[0],
                  f"line 1 is {MAX_LINE_CHARS + 1} characters long"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_prompt_file_is_one_line_exit_2(case, tiny_flux_dir, tmp_path, capsys):
    from fastvideo.data_preprocess.preprocess_flux_embedding import cli

    make, needle = CASES[case]
    path = make(tmp_path)
    capsys.readouterr()
    try:
        code = cli(["--model_path", str(tiny_flux_dir), "--prompt_dir", str(path), "--output_dir",
                    str(tmp_path / "out")])
    except SystemExit as stop:
        code = stop.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert needle in err[0] and str(path)[:40] in err[0], err[0]


def test_a_source_path_too_long_for_the_file_system_is_one_line(tmp_path):
    from fastvideo.data.sources import SourceImageError, open_rgb

    with pytest.raises(SourceImageError, match="cannot be looked up: File name too long"):
        open_rgb(tmp_path / ("x" * 5000 + ".png"))


def test_a_source_vae_size_no_source_may_have_is_refused_before_the_family_is_asked():
    from fastvideo.data_preprocess.sources import source_vae_family
    from fastvideo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--source_vae_size 65536,65536: 4295\.0 MP, over the 16\.8 MP"):
        source_vae_family("flux", (65536, 65536))
    with pytest.raises(ConfigError, match="resizes none"):  # a size within the bound: the family's own check
        source_vae_family("flux", (4096, 4096))
