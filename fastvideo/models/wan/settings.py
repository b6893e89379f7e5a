"""The Wan family's own settings (section "wan" of config.json): how many frames a sample has."""

from __future__ import annotations

from dataclasses import dataclass

from fastvideo.models.frames_settings import FramesSettings

DEFAULT_FRAMES = 81  # WanPipeline.__call__'s num_frames


@dataclass
class WanSettings(FramesSettings):
    num_frames: int = DEFAULT_FRAMES

    section = "wan"
    group = "wan (video)"
    frames_help = ("frames per sample, 4k+1 (Wan's VAE compresses 4 frames to one after the first): 81 as "
                   "WanPipeline, 5 for a short clip, 1 for single images (DanceGRPO's Wan-as-images recipe)")

    @staticmethod
    def check_frames(num_frames: int, error) -> int:
        from fastvideo.models.wan.components import check_num_frames

        return check_num_frames(num_frames, error)
