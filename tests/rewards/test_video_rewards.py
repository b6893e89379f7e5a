"""Rewards over clips (fastvideo/rewards/video.py, frames.py): image rewards score the frames
--video_reward_frames selects and average them per clip (checked against scoring each frame alone),
`first` and `all` differ on the same clips, a clip reward receives the frame dimension, image batches
take the image path unchanged, and the flag's bad values fail in one line."""

from __future__ import annotations

import pytest
import torch

from fastvideo.rewards.combine import MultiReward
from fastvideo.rewards.compressibility import JpegCompressibilityReward
from fastvideo.rewards.frames import FrameSelection, parse_frame_selection
from fastvideo.rewards.video import ClipReward, score

PROMPTS = ["a cat", "a dog"]


def _clips(frames: int = 5) -> torch.Tensor:
    """[2, F, 3, 32, 32] in [0, 1]: frame 0 flat (compresses well), later frames noisier."""
    g = torch.Generator().manual_seed(0)
    noise = torch.rand(2, frames, 3, 32, 32, generator=g)
    level = torch.linspace(0, 1, frames).view(1, frames, 1, 1, 1)
    return (0.5 + (noise - 0.5) * level).clamp(0, 1)


class Recorder(ClipReward):
    """A clip reward: the mean of each clip's frame-to-frame change (0 for a still clip)."""

    name = "motion"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.shapes = []

    def _score_clips(self, clips, prompts):
        self.shapes.append(tuple(clips.shape))
        return (clips[:, 1:] - clips[:, :-1]).abs().mean(dim=(1, 2, 3, 4)) if clips.shape[1] > 1 else \
            torch.zeros(clips.shape[0])


def test_frame_selection_parses_and_refuses_in_one_line():
    from fastvideo.errors import ConfigError

    assert [parse_frame_selection(t).indices(9) for t in ("all", "first", "every:4", "every:1")] == [
        list(range(9)), [0], [0, 4, 8], list(range(9))]
    assert str(parse_frame_selection("every:4")) == "every:4" and FrameSelection().indices(1) == [0]
    for bad in ("last", "every:0", "every:", "every:x", "2"):
        with pytest.raises(ConfigError) as exc:
            parse_frame_selection(bad)
        assert "\n" not in str(exc.value) and "all, first or every:K" in str(exc.value)


def test_image_rewards_average_the_selected_frames_and_first_differs_from_all():
    """Each clip's score is the mean of the reward of its selected frames, each scored as an image with
    its clip's prompt; on the same clips `first` and `all` give different rewards."""
    reward, clips = JpegCompressibilityReward(), _clips()
    per_frame = torch.stack([reward(clips[:, f], PROMPTS) for f in range(5)], dim=1)  # [2, 5]
    got = {t: score(reward, clips, PROMPTS, parse_frame_selection(t)) for t in ("all", "first", "every:2")}
    torch.testing.assert_close(got["all"], per_frame.mean(dim=1))
    torch.testing.assert_close(got["first"], per_frame[:, 0])
    torch.testing.assert_close(got["every:2"], per_frame[:, [0, 2, 4]].mean(dim=1))
    assert got["all"].shape == (2,) and not torch.allclose(got["first"], got["all"], atol=1e-3)


def test_multireward_scores_clips_through_the_selection_and_images_unchanged():
    reward, clips = JpegCompressibilityReward(), _clips()
    first = MultiReward([("compressibility", 1.0, reward)], frames=FrameSelection("first"))
    every = MultiReward([("compressibility", 1.0, reward)])  # default: all frames
    assert not torch.allclose(first(clips, PROMPTS).total, every(clips, PROMPTS).total, atol=1e-3)
    torch.testing.assert_close(first(clips, PROMPTS).total, reward(clips[:, 0], PROMPTS))
    images = clips[:, 3]  # an image batch [B, 3, H, W]: the image path, the selection never read
    torch.testing.assert_close(first(images, PROMPTS).total, reward(images, PROMPTS), rtol=0, atol=0)


def test_a_clip_reward_receives_the_frame_dimension():
    """A reward that declares takes_clips gets [B, F, 3, H, W] (chunked by batch_size), whatever the
    frame selection; an image batch reaches it as one-frame clips; next to an image reward in one run."""
    clip, clips = Recorder(batch_size=1), _clips()
    multi = MultiReward([("motion", 1.0, clip), ("compressibility", 0.5, JpegCompressibilityReward())],
                        frames=FrameSelection("first"))
    out = multi(clips, PROMPTS)
    assert clip.shapes == [(1, 5, 3, 32, 32)] * 2
    expected = (clips[:, 1:] - clips[:, :-1]).abs().mean(dim=(1, 2, 3, 4))
    torch.testing.assert_close(out.raw["motion"], expected)
    assert float(out.raw["motion"].min()) > 0
    clip.shapes.clear()
    still = multi(clips[:, 0], PROMPTS).raw["motion"]
    assert clip.shapes == [(1, 1, 3, 32, 32)] * 2 and torch.equal(still, torch.zeros(2))


def test_a_clip_reward_refuses_what_is_not_a_clip_batch():
    from fastvideo.rewards.base import RewardInputError

    with pytest.raises(RewardInputError, match=r"\[B, F, 3, H, W\]"):
        Recorder()(_clips()[:, 0], PROMPTS)
    with pytest.raises(RewardInputError, match="one prompt per clip"):
        Recorder()(_clips(), PROMPTS[:1])
    with pytest.raises(RewardInputError, match=r"\[0, 1\]"):
        Recorder()(_clips() * 2, PROMPTS)


def test_evaluation_scores_clips_over_every_frame():
    """eval.core.score_images: a clip's evaluation score is the mean of its frames' (image batches as before)."""
    from fastvideo.eval.core import score_images

    reward, clips = JpegCompressibilityReward(), _clips()
    got = score_images({"compressibility": reward}, clips, PROMPTS)
    per_frame = torch.stack([reward(clips[:, f], PROMPTS) for f in range(5)], dim=1)
    assert got.shape == (2, 1) and got.dtype == torch.float64
    torch.testing.assert_close(got[:, 0], per_frame.mean(dim=1).double())
    torch.testing.assert_close(score_images({"c": reward}, clips[:, 2], PROMPTS)[:, 0], reward(clips[:, 2], PROMPTS).double())
