"""The Wan family's own settings (section "wan" of config.json): how many frames a sample has."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, flag_group

DEFAULT_FRAMES = 81  # WanPipeline.__call__'s num_frames


@dataclass
class WanSettings(Settings):
    num_frames: int = DEFAULT_FRAMES
    guidance_scale_2: float | None = None

    section = "wan"

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        group = flag_group(parser, "wan (video)")
        group.add_argument(
            "--num_frames", type=int, default=DEFAULT_FRAMES,
            help="frames per sample, 4k+1 (Wan's VAE compresses 4 frames to one after the first): 81 as "
                 "WanPipeline, 5 for a short clip, 1 for single images (DanceGRPO's Wan-as-images recipe)")
        group.add_argument(
            "--guidance_scale_2", type=float, default=None,
            help="a two-expert folder (Wan2.2-A14B): the low-noise expert's guidance scale (WanPipeline's "
                 "guidance_scale_2; default: --guidance_scale); refused for a one-expert folder")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "WanSettings":
        return cls(num_frames=args.num_frames, guidance_scale_2=args.guidance_scale_2).checked()

    def check(self) -> None:
        from fastvideo.models.wan.components import check_num_frames

        check_num_frames(self.num_frames, ConfigError)

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"num_frames": section["num_frames"], "guidance_scale_2": section.get("guidance_scale_2")}
