"""A user error's one line: run a command-line entry point and get the single stderr line it ended with."""

from __future__ import annotations


def one_line(capsys, run) -> str:
    """``run()`` (an entry point called in this process) must end with exit 2, no traceback and one
    non-empty stderr line: that line."""
    capsys.readouterr()
    try:
        code = run()
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]
