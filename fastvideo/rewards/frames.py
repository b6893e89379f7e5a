"""--video_reward_frames: which frames of a clip an image reward scores (rewards/video.py applies it).
Standard library only: the flags are parsed before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass

from fastvideo.errors import ConfigError

FRAME_CHOICES = "all, first or every:K (K >= 1)"


@dataclass(frozen=True)
class FrameSelection:
    """Which frames of a clip an image reward scores: mode "all", "first" or "every" (every ``step``-th
    frame from the first)."""

    mode: str = "all"
    step: int = 1

    def __str__(self) -> str:
        return f"every:{self.step}" if self.mode == "every" else self.mode

    def indices(self, frames: int) -> list[int]:
        """The selected frame indices of a clip of ``frames`` frames (the first is always among them)."""
        if self.mode == "first":
            return [0]
        return list(range(0, frames, self.step if self.mode == "every" else 1))


def parse_frame_selection(text: str) -> FrameSelection:
    """``all`` | ``first`` | ``every:K`` -> FrameSelection; ConfigError in one line otherwise."""
    value = str(text).strip()
    if value in ("all", "first"):
        return FrameSelection(value)
    head, _, tail = value.partition(":")
    if head == "every" and tail.isdigit() and int(tail) >= 1:
        return FrameSelection("every", int(tail))
    raise ConfigError(f"--video_reward_frames {text!r}: use {FRAME_CHOICES}")
