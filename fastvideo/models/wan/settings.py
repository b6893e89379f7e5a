"""The Wan family's own settings (section "wan" of config.json): how many frames a sample has."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.models.frames_settings import FramesSettings
from fastvideo.settings import flag_group

DEFAULT_FRAMES = 81  # WanPipeline.__call__'s num_frames
EXPERT_CHOICES = ("high,low", "high", "low")  # --train_experts (models/wan/experts.py: high = transformer)


@dataclass
class WanSettings(FramesSettings):
    num_frames: int = DEFAULT_FRAMES
    guidance_scale_2: float | None = None
    train_experts: str = "high,low"

    section = "wan"
    group = "wan (video)"
    frames_help = ("frames per sample, 4k+1 (Wan's VAE compresses 4 frames to one after the first): 81 as "
                   "WanPipeline, 5 for a short clip, 1 for single images (DanceGRPO's Wan-as-images recipe)")

    @staticmethod
    def check_frames(num_frames: int, error) -> int:
        from fastvideo.models.wan.components import check_num_frames

        return check_num_frames(num_frames, error)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        super().add_flags(parser)  # --num_frames
        group = flag_group(parser, cls.group)
        group.add_argument(
            "--guidance_scale_2", type=float, default=None,
            help="a two-expert folder (Wan2.2-A14B): the low-noise expert's guidance scale (WanPipeline's "
                 "guidance_scale_2; default: --guidance_scale); refused for a one-expert folder")
        group.add_argument(
            "--train_experts", default="high,low", choices=EXPERT_CHOICES,
            help="a two-expert folder (Wan2.2-A14B): which experts train, the high-noise transformer, the "
                 "low-noise transformer_2 or both (default); the other is frozen. A one-expert folder: high,low "
                 "only")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "WanSettings":
        return cls(num_frames=args.num_frames, guidance_scale_2=args.guidance_scale_2,
                   train_experts=args.train_experts).checked()

    def check(self) -> None:
        super().check()
        if self.train_experts not in EXPERT_CHOICES:
            raise ConfigError(f"--train_experts {self.train_experts!r}: choose {', '.join(EXPERT_CHOICES)}")

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        return {**super().flags_from_resolved(section), "guidance_scale_2": section.get("guidance_scale_2"),
                "train_experts": section.get("train_experts", "high,low")}
