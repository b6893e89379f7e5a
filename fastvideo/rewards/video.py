"""Rewards over clips: how a batch of decoded clips [B, F, 3, H, W] (float32 in [0, 1], the video
families' decode, kept as tensors from the rollout to the reward: nothing is written or re-decoded)
reaches the rewards.

- An image reward (every built-in one: HPSv2.1, PickScore, CLIP, aesthetic, compressibility, ...)
  scores the frames ``--video_reward_frames`` selects: ``all``, ``first`` or ``every:K`` (frames 0,
  K, 2K, ...; verl-omni scores Wan2.2 clips with HPSv3 on every 4th frame), each frame with its
  clip's prompt, and a clip's score is the mean over its selected frames.
- A clip reward (a class that sets ``takes_clips = True``, e.g. a subclass of :class:`ClipReward`)
  receives the whole clips [B, F, 3, H, W] and returns [B] (a served VideoAlign plugs in here).

An image batch [B, 3, H, W] goes to an image reward as it is (the image families' path, unchanged)
and to a clip reward as one-frame clips [B, 1, 3, H, W].
"""

from __future__ import annotations

import abc
from typing import Sequence

import torch

from fastvideo.rewards.base import BatchedReward, RewardInputError, check_inputs, takes_sources
from fastvideo.rewards.frames import FrameSelection, parse_frame_selection  # noqa: F401 (this module's API)


def takes_clips(reward) -> bool:
    """Whether ``reward`` is given whole clips [B, F, 3, H, W] (its class says ``takes_clips = True``)."""
    return bool(getattr(reward, "takes_clips", False))


def check_clips(clips: torch.Tensor, n_prompts: int) -> None:
    """clips must be a float tensor [B, F, 3, H, W] with one prompt per clip."""
    if not isinstance(clips, torch.Tensor) or clips.ndim != 5 or clips.shape[2] != 3:
        shape = list(clips.shape) if isinstance(clips, torch.Tensor) else type(clips).__name__
        raise RewardInputError(f"clips must be a float tensor [B, F, 3, H, W]; got {shape}")
    if clips.shape[0] != n_prompts:
        raise RewardInputError(f"{clips.shape[0]} clips but {n_prompts} prompts; give one prompt per clip")


def score(reward, images: torch.Tensor, prompts: Sequence[str], frames: FrameSelection, sources=None) -> torch.Tensor:
    """One reward's scores [B] of images [B, 3, H, W] or clips [B, F, 3, H, W]: a clip reward gets the
    clips (images as one-frame clips); an image reward gets the images, or the selected frames of the
    clips with each clip's prompt (B k images in one call) and returns their mean per clip."""
    extra = {"sources": sources} if takes_sources(reward) else {}
    if takes_clips(reward):
        clips = images if images.ndim == 5 else images.unsqueeze(1)
        return reward(clips, prompts, **extra)
    if not isinstance(images, torch.Tensor) or images.ndim != 5:
        return reward(images, prompts, **extra)
    check_clips(images, len(prompts))
    b = images.shape[0]
    chosen = frames.indices(images.shape[1])
    flat = images[:, chosen].reshape(b * len(chosen), *images.shape[2:])
    per_frame = [p for p in prompts for _ in chosen]
    if extra:
        extra = {"sources": sources.repeat_interleave(len(chosen), dim=0)}
    return reward(flat, per_frame, **extra).reshape(b, len(chosen)).mean(dim=1)


class ClipReward(BatchedReward):
    """Base of a reward that scores whole clips: ``_score_clips(clips [b, F, 3, H, W], prompts) -> [b]``
    on chunks of ``batch_size`` clips, without gradients; BatchedReward's device, dtype and chunking,
    each clip's frames checked as BatchedReward checks images (float, finite, in [0, 1])."""

    name = "clip_reward"
    takes_clips = True

    @abc.abstractmethod
    def _score_clips(self, clips: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """Scores [b] of one chunk of clips [b, F, 3, H, W] in [0, 1]."""

    def _score(self, images, prompts):
        return self._score_clips(images, prompts)

    def __call__(self, clips: torch.Tensor, prompts: Sequence[str], sources=None) -> torch.Tensor:
        check_clips(clips, len(prompts))
        check_inputs(clips.flatten(0, 1), [p for p in prompts for _ in range(clips.shape[1])])
        out = []
        with torch.no_grad():
            for start in range(0, clips.shape[0], self.batch_size):
                chunk = slice(start, start + self.batch_size)
                out.append(self._score_clips(clips[chunk], list(prompts[chunk])).detach().float().reshape(-1).cpu())
        result = torch.cat(out)
        if result.shape != (clips.shape[0],):
            raise RuntimeError(f"{self.name} returned {list(result.shape)} scores for {clips.shape[0]} clips")
        return result


def score_clips_each(reward, clips: torch.Tensor, prompts: Sequence[str]) -> tuple[torch.Tensor, dict[int, str]]:
    """(scores [B], {index: reason}) of a clip reward over clips [B, F, 3, H, W], a clip it fails on
    dropped instead of failing the batch: the batch is scored in one call; when that raises (anything
    but RewardInputError, the caller's mistake) each clip is scored alone and the clips that still
    raise get NaN and their reason (the reward server's per-clip failures: the trainer drops them,
    never scoring them 0 or -1 as DanceGRPO's reward code does on any failure)."""
    check_clips(clips, len(prompts))
    try:
        return reward(clips, list(prompts)).float(), {}
    except RewardInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - which clip failed is found below, one clip at a time
        first = f"{type(exc).__name__}: {exc}"[:300]
    scores, failed = torch.full((clips.shape[0],), float("nan")), {}
    if clips.shape[0] == 1:  # that clip is the one: not scored twice
        return scores, {0: first}
    for i in range(clips.shape[0]):
        try:
            scores[i] = reward(clips[i:i + 1], [prompts[i]]).float().reshape(())
        except RewardInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per clip in the reply
            failed[i] = f"{type(exc).__name__}: {exc}"[:300]
    return scores, failed
