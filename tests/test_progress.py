"""fastvideo.progress: a live bar on a terminal, a few plain lines in a log, nothing on other ranks."""

from __future__ import annotations

import io

from fastvideo.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _run(stream, total=8, **kw):
    bar = Progress(total, "encoding", unit="prompt", stream=stream, **kw)
    for _ in range(total):
        bar.update(1)
    bar.close()
    bar.close()
    return stream.getvalue()


def test_a_log_gets_plain_lines_every_quarter_and_at_the_end():
    out = _run(io.StringIO())
    assert "\r" not in out
    assert out.splitlines() == ["encoding: 2/8 prompt (25%)", "encoding: 4/8 prompt (50%)",
                                "encoding: 6/8 prompt (75%)", "encoding: 8/8 prompt (100%)"]


def test_big_steps_print_one_line_each_not_one_per_threshold_crossed():
    stream = io.StringIO()
    bar = Progress(10, "eval", stream=stream, log_every=10)
    bar.update(7)
    bar.update(1)
    bar.close()  # stopped early: the last count is not printed twice
    assert stream.getvalue().splitlines() == ["eval: 7/10 it (70%)", "eval: 8/10 it (80%)"]


def test_other_ranks_and_callers_with_their_own_lines_print_nothing_in_a_log():
    assert _run(io.StringIO(), enabled=False) == ""
    assert _run(io.StringIO(), log_lines=False) == ""
    assert _run(io.StringIO(), total=0) == ""


def test_a_terminal_gets_a_live_bar():
    out = _run(_Terminal())
    assert "\r" in out and "encoding" in out and "prompt" in out
    assert _run(_Terminal(), enabled=False) == ""
