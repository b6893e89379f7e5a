"""Errors a user can fix, and how command-line entry points report them.

A ``UserError`` is about a flag, a missing or malformed input, or a checkpoint: its message already
names the problem and the fix, so a traceback would only hide it. Entry points print the message
alone and exit 2; anything else is a bug or an environment failure and keeps its traceback.
``FASTVIDEO_DEBUG=1`` prints the traceback for user errors too.
"""

from __future__ import annotations

import os
import sys
import traceback

USER_ERROR_EXIT = 2


class UserError(Exception):
    """Something the user can fix; the message says what and how."""


class ConfigError(UserError, ValueError):
    """A flag value, or a combination of flags, that cannot work. The one error type of
    configuration: every component's settings raise it directly (fastvideo.settings)."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint (training state or reward weights) is missing, incomplete, or unsafe to load."""


class MissingInputError(UserError, FileNotFoundError):
    """A file or folder the run needs (weights, a config) is not where the flags say."""


class InputFileError(UserError, ValueError):
    """A file the run reads is there but damaged or malformed (a model's config.json or weights,
    an embedding index, a --config file)."""


class DiskFullError(UserError, OSError):
    """A write failed for want of space (ENOSPC, EDQUOT): the message names what was being written;
    the user frees space and resumes from the last complete checkpoint."""


class ServiceError(UserError, RuntimeError):
    """A service the run depends on (a reward server) failed mid-run: it answered garbage, refused
    the token, or stopped answering. The message names the service, what it did and the last
    complete checkpoint, which is intact: the user fixes the service and resumes."""


_DISK_FULL = ("no space left on device", "disk quota exceeded", "storagefull")


def is_disk_full(exc: BaseException | str | None) -> bool:
    """Whether ``exc`` (an exception or its description) is a full disk or quota, whatever raised it
    (an OSError's errno; safetensors' own error type only says it in its text)."""
    if isinstance(exc, OSError) and exc.errno in (28, 122):  # ENOSPC, EDQUOT (Linux)
        return True
    return exc is not None and any(s in str(exc).lower() for s in _DISK_FULL)


class DeviceError(UserError, RuntimeError):
    """FASTVIDEO_DEVICE names a device type that does not exist or is not usable here."""


def debug_enabled() -> bool:
    return os.environ.get("FASTVIDEO_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def report_failure(exc: BaseException, prog: str, rank: int | None = None) -> int:
    """Print ``exc`` for the user and return the exit status (2 for a UserError, else 1)."""
    where = f"[rank {rank}] " if rank is not None else ""
    user = isinstance(exc, UserError)
    if user:
        sys.stderr.write(f"{where}{prog}: error: {one_line(exc)}\n")
    else:
        sys.stderr.write(f"{where}{prog} failed: {type(exc).__name__}: {exc}\n")
    if not user or debug_enabled():
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    sys.stderr.flush()
    return USER_ERROR_EXIT if user else 1


def one_line(message: object) -> str:
    """A message on one line (a user error's report is one line: its own newlines become '; ')."""
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())


def one_line_errors(parser):
    """Make an argparse parser report a bad flag as one line, ``PROG: error: MESSAGE``, exit 2
    (argparse prints its usage first; ``--help`` still shows it). Returns the parser."""

    def error(message: str):
        sys.stderr.write(f"{parser.prog}: error: {one_line(message)} (see --help)\n")
        sys.stderr.flush()
        raise SystemExit(USER_ERROR_EXIT)

    parser.error = error
    return parser


def exit_on_user_error(prog: str, exc: BaseException, rank: int | None = None):
    """Report ``exc`` -- which the calling entry point has judged to be the user's mistake (a
    UserError, or e.g. the ValueError of a bad argument) -- as one line and exit 2; with
    FASTVIDEO_DEBUG=1 its traceback follows. Never returns."""
    where = f"[rank {rank}] " if rank is not None else ""
    sys.stderr.write(f"{where}{prog}: error: {one_line(exc)}\n")
    if debug_enabled():
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    sys.stderr.flush()
    raise SystemExit(USER_ERROR_EXIT) from None
