"""--config FILE: flag values from a YAML or JSON file, overridden by the command line.

Two forms are read:

- flat: ``{flag name: value}`` (``learning_rate: 1e-5``, ``use_group: true``), any flag of the
  parser, spelt as on the command line without ``--``;
- resolved: a run's OUTPUT_DIR/config.json (TrainConfig.to_json plus "derived" and "device"), which
  each component turns back into its flags (Settings.flags_from_resolved), so that the file alone
  reproduces the run's configuration.

Values are checked against the flag's declaration (ConfigError naming the key and the expected
type, or the closest flag name for an unknown key), then become the parser's defaults: a flag
given on the command line still wins, and components validate file values like typed ones.
"""

from __future__ import annotations

import argparse
import difflib
import json
from dataclasses import fields
from pathlib import Path

from fastvideo.errors import ConfigError

__all__ = ["add_flags", "apply_file", "check_resolved_keys", "dump", "file_values", "read_file", "selected"]

# Keys of config.json that are reports of the run, not configuration.
REPORT_KEYS = ("derived", "device", "compat_notes")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """--config and --print_config: how the configuration is read and shown, not part of it."""
    from fastvideo.settings import flag_group

    g = flag_group(parser, "essentials")
    g.add_argument("--config", type=str, default=None, metavar="FILE",
                   help="YAML or JSON file of flag values (flag names as keys, or a run's OUTPUT_DIR/config.json); "
                        "flags on the command line override it")
    g.add_argument("--print_config", nargs="?", const="yaml", default=None, choices=["yaml", "json"],
                   help="print the resolved configuration (a valid --config file) and exit")


def selected(argv) -> tuple[str, str]:
    """(--algorithm, --model_family) as ``argv`` gives them, else as its --config file does, else the
    defaults: which plugins' flags the parser needs before it can parse."""
    pre = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    for flag in ("--config", "--algorithm", "--model_family"):
        pre.add_argument(flag, type=str, default=None)
    given = pre.parse_known_args(list(argv))[0]
    data = read_file(given.config) if given.config else {}
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    return (given.algorithm or data.get("algorithm") or "grpo",
            given.model_family or data.get("model_family") or model.get("family") or "flux")


def read_file(path: str) -> dict:
    """The mapping in a .json, .yaml or .yml file (other suffixes: JSON, else YAML)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not a text file (not UTF-8); give a .json or .yaml file, "
                          "e.g. a run's OUTPUT_DIR/config.json") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else _yaml_or_json(text)
    except ValueError as exc:  # json.JSONDecodeError and yaml.YAMLError (re-raised as ValueError)
        raise ConfigError(f"--config {path}: not valid {'JSON' if p.suffix == '.json' else 'YAML/JSON'}: {exc}")
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: the file must hold a mapping of flag names to values")
    return data


# YAML 1.1 reads 1e-5 as a string; this (YAML 1.2's) pattern makes it the number users mean.
_FLOAT = (r"^[-+]?((\.[0-9]+|[0-9]+\.[0-9]*)([eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)$"
          r"|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")


def _yaml_or_json(text: str):
    try:
        import yaml
    except ImportError:  # PyYAML is a dependency; without it JSON still works
        return json.loads(text)

    class Loader(yaml.SafeLoader):
        pass

    import re

    Loader.yaml_implicit_resolvers = {k: [r for r in v if r[0] != "tag:yaml.org,2002:float"]
                                      for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_FLOAT), list("-+0123456789."))
    try:
        return yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


def _actions_by_name(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option name without its dashes (aliases included) -> its action."""
    return {s.lstrip("-"): a for a in parser._actions if a.option_strings and a.dest != "help"
            for s in a.option_strings if s.startswith("--")}


def _expected(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "a boolean (true/false)"
    kind = {int: "an integer", float: "a number"}.get(action.type, "a string")
    return kind + (" or null" if action.default is None else "")


def _checked(key: str, value, action: argparse.Action):
    """value as the flag's type; ConfigError naming the key and the expected type."""
    if value is None and action.default is None:
        return None
    if isinstance(action, argparse._StoreTrueAction):
        ok = isinstance(value, bool)
    elif action.type is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif action.type is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"--config: {key}: expected {_expected(action)}, got {value!r}")
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"--config: {key}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def file_values(data: dict, parser: argparse.ArgumentParser, from_resolved, problems: list | None = None) -> dict:
    """{dest: checked value} from a file's mapping. from_resolved(data) -> {flag: value} turns a
    resolved config (a run's config.json) into flags. Every bad key is found: with a ``problems``
    list each is appended there (and left out of the values), else one ConfigError names them all,
    one per line."""
    if isinstance(data.get("model"), dict):
        data = from_resolved({k: v for k, v in data.items() if k not in REPORT_KEYS})
    actions, values, found = _actions_by_name(parser), {}, []
    for key, value in data.items():
        try:
            values.update(_file_value(key, value, actions))
        except ConfigError as exc:
            found.append(str(exc))
    if problems is not None:
        problems.extend(found)
    elif found:
        raise ConfigError("\n".join(found))
    return values


def _file_value(key: str, value, actions: dict[str, argparse.Action]) -> dict:
    """{dest: checked value} for one key of a file; ConfigError naming the key."""
    if key not in actions:
        close = difflib.get_close_matches(str(key), actions, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"--config: unknown key {key!r}{hint} (keys are flag names without --)")
    if actions[key].dest == "config":
        raise ConfigError("--config: a file cannot name another --config file")
    return {actions[key].dest: _checked(key, value, actions[key])}


def check_resolved_keys(resolved: dict, top: type, sections: dict[str, type]) -> None:
    """ConfigError naming the keys of a resolved config that are not fields of the dataclass
    ``top`` (TrainConfig) or of its sections' settings classes."""
    unknown = [k for k in resolved if k not in {f.name for f in fields(top)} | set(REPORT_KEYS)]
    for name, cls in sections.items():
        section = resolved.get(name) if name in resolved else (resolved.get("plugins") or {}).get(name)
        if isinstance(section, dict):
            known = {f.name for f in fields(cls)} | set(getattr(cls, "moved_keys", ()))
            unknown += [f"{name}.{k}" for k in section if k not in known]
    if unknown:
        raise ConfigError(f"--config: unknown key(s) {', '.join(unknown)} in a resolved configuration")


def apply_file(parser: argparse.ArgumentParser, argv, from_resolved, problems: list | None = None) -> None:
    """With --config FILE in argv (None: sys.argv), make the file's values the parser's defaults:
    the command line still overrides them, and a required flag the file gives need not be repeated.
    With a ``problems`` list, the file's bad keys are appended there and its good ones still apply."""
    pre = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    pre.add_argument("--config", type=str, default=None)
    path = pre.parse_known_args(argv)[0].config
    if not path:
        return
    values = file_values(read_file(path), parser, from_resolved, problems)
    parser.set_defaults(**values)
    for action in parser._actions:
        if action.dest in values:
            action.required = False


def dump(resolved: dict, fmt: str) -> str:
    """The resolved config as JSON or YAML text (both read back by --config)."""
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(resolved, sort_keys=False)
    return json.dumps(resolved, indent=2)
