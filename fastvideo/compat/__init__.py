"""Upstream launch lines, unchanged: DanceGRPO's and MixGRPO's flag names and values translated into
this trainer's component flags before any component reads them.

    add_flags(parser)                 the compatibility-only flags (components never declare them)
    translate(args, defaults)         -> (a translated copy of args, start-up notes); args is not written

After translation no compatibility name is read by a component's settings; each compatibility flag
either works (it is mapped onto a component flag), or is refused with the reason, or is listed in a
start-up note as having no effect.
"""

from __future__ import annotations

import argparse

from fastvideo.compat import dancegrpo, mixgrpo


def add_flags(parser: argparse.ArgumentParser) -> None:
    dancegrpo.add_flags(parser)
    mixgrpo.add_flags(parser)


def translate(args: argparse.Namespace,
              defaults: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    """Apply DanceGRPO's then MixGRPO's translations; ConfigError for what is refused."""
    changes, notes = dancegrpo.translate(args, defaults)
    more, more_notes = mixgrpo.translate(args, defaults)
    return argparse.Namespace(**{**vars(args), **changes, **more}), notes + more_notes
