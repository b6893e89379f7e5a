"""The HunyuanVideo family's own settings (section "hunyuan_video" of config.json): frames per sample."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, flag_group

DEFAULT_FRAMES = 129  # HunyuanVideoPipeline.__call__'s num_frames


@dataclass
class HunyuanVideoSettings(Settings):
    num_frames: int = DEFAULT_FRAMES

    section = "hunyuan_video"

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        flag_group(parser, "hunyuan_video (video)").add_argument(
            "--num_frames", type=int, default=DEFAULT_FRAMES,
            help="frames per sample, 4k+1 (the VAE compresses 4 frames to one after the first): 129 as "
                 "HunyuanVideoPipeline, 53 as DanceGRPO's HunyuanVideo recipe, 5 for a short clip")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "HunyuanVideoSettings":
        return cls(num_frames=args.num_frames).checked()

    def check(self) -> None:
        from fastvideo.models.hunyuan_video.components import check_frames

        check_frames(self.num_frames, ConfigError)

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {"num_frames": section["num_frames"]}
