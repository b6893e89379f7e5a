"""A video family's own settings section: the clip length (--num_frames), checked by the family's rule.

A family subclasses FramesSettings with its ``section`` (config.json's key), its default
``num_frames``, the flag group's title, the flag's help and ``check_frames`` (its frame rule, imported
lazily so that --help stays without torch)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, flag_group


@dataclass
class FramesSettings(Settings):
    num_frames: int = 1

    section = ""
    group = ""  # the flag group's title in --help
    frames_help = ""

    @staticmethod
    def check_frames(num_frames: int, error) -> int:
        """``num_frames`` when the family takes it, else ``error`` in one line."""
        raise NotImplementedError

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        default = next(f.default for f in fields(cls) if f.name == "num_frames")
        flag_group(parser, cls.group).add_argument("--num_frames", type=int, default=default, help=cls.frames_help)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "FramesSettings":
        return cls(num_frames=args.num_frames).checked()

    def check(self) -> None:
        self.check_frames(self.num_frames, ConfigError)

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"num_frames": section["num_frames"]}
