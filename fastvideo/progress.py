"""Progress as users look at it: a live bar on a terminal, a few plain lines in a redirected log.

tqdm's redraws ("\\r" fragments) glued to the lines of a batch job's log are noise; off a terminal a
phase prints ``desc: done/total (pct%)`` at most every ``log_every`` percent and once at the end.
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    """``update(n)`` / ``close()`` like tqdm. ``enabled`` False (other ranks) prints nothing;
    ``log_lines`` False prints nothing off a terminal (the caller logs its own lines there)."""

    def __init__(self, total: int, desc: str, unit: str = "it", enabled: bool = True, log_lines: bool = True,
                 log_every: float = 25.0, initial: int = 0, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.desc, self.unit, self.done = int(total), desc, unit, int(initial)
        self.terminal = enabled and _is_terminal(self.stream)
        self.lines = enabled and log_lines and not self.terminal and self.total > 0
        self.log_every = log_every
        self._next_pct = log_every
        self._printed = -1  # the count of the last line printed
        self.bar = None
        if self.terminal:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.done, desc=desc, unit=unit, file=self.stream,
                            dynamic_ncols=True, leave=False)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.lines and self.done < self.total and 100.0 * self.done / self.total >= self._next_pct:
            self._line()
            while self._next_pct <= 100.0 * self.done / self.total:
                self._next_pct += self.log_every

    def set_postfix(self, **values) -> None:
        if self.bar is not None:
            self.bar.set_postfix(**values)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.lines and self._printed != self.done:
            self._line()
        self.lines = False  # a second close prints nothing

    def _line(self) -> None:
        self._printed = self.done
        pct = 100.0 * self.done / self.total
        print(f"{self.desc}: {self.done}/{self.total} {self.unit} ({pct:.0f}%)", file=self.stream, flush=True)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
