"""The one parse check of the trainer's flags, shared by the launcher's pre-spawn check
(fastvideo.preflight) and the entry point run directly (fastvideo.config.parse_config).

It collects EVERY parse problem instead of stopping at the first: unknown flags (an abbreviation
is one: the parsers refuse prefixes) with the nearest known name, bad values, and each bad key of
a --config file. The parser comes in as ``build_parser(argv)`` so that this module needs nothing
of fastvideo.config (which imports it).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Callable

from fastvideo import config_file
from fastvideo.errors import USER_ERROR_EXIT, ConfigError, UserError

BuildParser = Callable[[list[str]], argparse.ArgumentParser]


class _ParseError(Exception):
    pass


def one_line(text: object) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _raising_parser(argv: list[str], build_parser: BuildParser) -> argparse.ArgumentParser:
    """The trainer's parser for ``argv`` (with the flags of the plugin it selects), raising on a
    bad flag instead of exiting."""
    parser = build_parser(argv)

    def refuse(message):
        raise _ParseError(message)

    parser.error = refuse
    return parser


def _unknown_flag_problems(parser, extras: list[str]) -> list[str]:
    known = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    problems = []
    for word in extras:
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0]
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        problems.append(f"unknown flag {name}" + (f" (did you mean {near[0]}?)" if near else ""))
    return problems


def _stray_word_problems(parser, extras: list[str], argv: list[str]) -> list[str]:
    """A word the parser took for no flag: a value given to a flag that takes none (``--use_group
    false``, which would otherwise read as --use_group on) or a stray word; one line each. A word
    right after a flag that takes a value is that value, after an unknown flag that flag's (reported
    as the flag)."""
    switches = {s for a in parser._actions if a.nargs == 0 for s in a.option_strings}
    known = {s for a in parser._actions for s in a.option_strings}
    stray = [w for w in extras if not w.startswith("--")]
    problems = []
    for i, word in enumerate(argv):
        if word.startswith("--") or word not in stray:
            continue
        before = argv[i - 1] if i else ""
        if before.startswith("--") and "=" not in before and before not in switches:
            continue  # a known flag's value, or an unknown flag's
        stray.remove(word)
        if before in switches and before in known:
            problems.append(f"{before} takes no value (got {word!r}): write {before} to turn it on, leave it "
                            f"out to keep it off")
        else:
            problems.append(f"unexpected word {word!r} on the command line (every setting is a --flag; a value "
                            f"belongs right after its flag)")
    return problems


def _drop_argument(argv: list[str], message: str) -> list[str] | None:
    """argv without the flag an argparse message names ("argument --h: invalid int value"), so
    that the parse can go on to the next problem; None when no flag is named."""
    m = re.match(r"argument (--[\w-]+)", message)
    if not m:
        return None
    names = {m.group(1)}
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word.split("=", 1)[0] in names:
            i += 1
            while i < len(argv) and "=" not in word and not argv[i].startswith("--"):
                i += 1
            continue
        out.append(word)
        i += 1
    return out if out != argv else None


def parse_all(argv: list[str], build_parser: BuildParser,
              from_resolved: Callable[[dict], dict]) -> tuple[argparse.Namespace | None, list[str]]:
    """(the parsed flags, or None when there is any problem; every parse problem, one line each)."""
    try:
        parser = _raising_parser(argv, build_parser)
    except UserError as exc:  # --algorithm / --model_family naming a plugin that does not resolve
        return None, [one_line(exc)]
    problems: list[str] = []
    try:
        config_file.apply_file(parser, argv, from_resolved, problems)
    except (UserError, _ParseError) as exc:
        problems.append(str(exc))
    problems = [one_line(p) for p in problems]
    rest = list(argv)
    for _ in range(20):
        try:
            args, extras = parser.parse_known_args(rest)
        except _ParseError as exc:
            problems.append(one_line(exc))
            rest = _drop_argument(rest, str(exc))
            if rest is None:
                return None, problems
            continue
        problems += _unknown_flag_problems(parser, extras) + _stray_word_problems(parser, extras, rest)
        return (args if not problems else None), problems
    return None, problems


def lenient_args(argv: list[str], build_parser: BuildParser) -> argparse.Namespace | None:
    """The flags that do parse once the bad ones are dropped (for the launcher's file checks)."""
    try:
        parser, rest = _raising_parser(argv, build_parser), list(argv)
    except UserError:
        return None
    for _ in range(20):
        try:
            return parser.parse_known_args(rest)[0]
        except _ParseError as exc:
            rest = _drop_argument(rest, str(exc))
            if rest is None:
                return None
    return None


def refuse(problems: list[str], usage: bool, prog: str = "train_grpo_flux"):
    """Report ``problems`` (``PROG: error: ...`` each, exit 2) or, with ``usage=False``, raise a
    ConfigError carrying them one per line (the entry point prints it once, on rank 0)."""
    problems = list(dict.fromkeys(problems))
    if not usage:
        raise ConfigError("\n".join(problems))
    for problem in problems:
        sys.stderr.write(f"{prog}: error: {problem}\n")
    sys.stderr.write(f"{prog}: {len(problems)} problem(s) in the flags (see --help)\n")
    sys.stderr.flush()
    raise SystemExit(USER_ERROR_EXIT)
