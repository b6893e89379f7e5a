"""The HunyuanVideo family's own settings (section "hunyuan_video" of config.json): frames per sample."""

from __future__ import annotations

from dataclasses import dataclass

from fastvideo.models.frames_settings import FramesSettings

DEFAULT_FRAMES = 129  # HunyuanVideoPipeline.__call__'s num_frames


@dataclass
class HunyuanVideoSettings(FramesSettings):
    num_frames: int = DEFAULT_FRAMES

    section = "hunyuan_video"
    group = "hunyuan_video (video)"
    frames_help = ("frames per sample, 4k+1 (the VAE compresses 4 frames to one after the first): 129 as "
                   "HunyuanVideoPipeline, 53 as DanceGRPO's HunyuanVideo recipe, 5 for a short clip")

    @staticmethod
    def check_frames(num_frames: int, error) -> int:
        from fastvideo.models.hunyuan_video.components import check_frames

        return check_frames(num_frames, error)
