"""MP4 clips through PyAV: a written clip reads back with its frame count, size and order, within a
stated error of a lossy codec; the PNG forms (strip, animated) are exact."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

av = pytest.importorskip("av")  # the video extra (env_setup.sh installs it on both lines)

from fastvideo import video_io  # noqa: E402

# H.264 4:2:0 at CRF 12 on smooth content: a mean absolute error under 3 levels in 255 (measured
# 1.65 here, mostly RGB -> YUV 4:2:0 -> RGB rounding); the clip read back in reversed frame order is
# off by about 31 levels, shifted by one frame by about 9.
MAX_MEAN_ABS_ERROR = 3.0


def moving_gradient(frames: int, height: int, width: int) -> torch.Tensor:
    """uint8 [F, 3, H, W]: smooth colour waves that slide by 6-8 pixels a frame (each frame differs)."""
    t = torch.arange(frames).view(frames, 1, 1).float()
    y = torch.arange(height).view(1, height, 1).float()
    x = torch.arange(width).view(1, 1, width).float()
    red = (60 + 120 * (0.5 + 0.5 * torch.sin((x + 8 * t) / 20))).expand(frames, height, width)
    green = (40 + 3 * y).expand(frames, height, width)
    blue = 200 - 110 * (0.5 + 0.5 * torch.cos((x + y - 6 * t) / 24))
    return torch.stack([red, green, blue], dim=1).round().clamp(0, 255).to(torch.uint8)


def mean_abs_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


def test_round_trip_keeps_the_count_the_size_and_the_order(tmp_path):
    clip = moving_gradient(9, 33, 46)  # an odd height: padded for 4:2:0, cropped back on reading
    path = video_io.write_mp4(clip, tmp_path / "clip.mp4", fps=16)
    back = video_io.read_video(path)
    assert back.dtype == torch.uint8 and tuple(back.shape) == (9, 3, 33, 46)
    error = mean_abs_error(back, clip)
    assert error < MAX_MEAN_ABS_ERROR
    assert mean_abs_error(back, clip.flip(0)) > 5 * MAX_MEAN_ABS_ERROR  # frame order matters
    assert mean_abs_error(back[1:], clip[:-1]) > 2 * MAX_MEAN_ABS_ERROR  # and no frame is dropped or doubled
    with av.open(str(path)) as c:  # a clip a browser plays: H.264, 4:2:0, the frame rate asked for
        stream = c.streams.video[0]
        assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")
        assert stream.average_rate == 16 and stream.frames == 9
    # [F, H, W, 3] and float frames in [0, 1] give the same file content
    hwc = video_io.write_mp4(clip.permute(0, 2, 3, 1).numpy(), tmp_path / "hwc.mp4", fps=16)
    floats = video_io.write_mp4(clip.float() / 255, tmp_path / "float.mp4", fps=16)
    assert torch.equal(video_io.read_video(hwc), back) and torch.equal(video_io.read_video(floats), back)


def test_the_mpeg4_fallback_and_the_bounds(tmp_path, monkeypatch):
    clip = moving_gradient(5, 32, 48)
    monkeypatch.setattr(video_io, "VIDEO_CODECS", ("no_such_encoder", "mpeg4"))
    assert video_io.video_codec() == "mpeg4"
    path = video_io.write_mp4(clip, tmp_path / "clip.mp4", fps=8)
    with av.open(str(path)) as c:
        assert c.streams.video[0].codec_context.name == "mpeg4"
    back = video_io.read_video(path)
    assert tuple(back.shape) == (5, 3, 32, 48)
    assert mean_abs_error(back, clip) < 2 * MAX_MEAN_ABS_ERROR < mean_abs_error(back, clip.flip(0))
    with pytest.raises(video_io.VideoSizeError, match="1536 pixels a frame, the limit is 1000"):
        video_io.read_video(path, max_pixels=1000)
    with pytest.raises(video_io.VideoSizeError, match="5 frames .the limit is 4"):
        video_io.read_video(path, max_frames=4)
    assert video_io.read_video(path, max_frames=5, max_pixels=1536).shape[0] == 5
    monkeypatch.setattr(video_io, "VIDEO_CODECS", ("no_such_encoder",))
    with pytest.raises(video_io.MissingInputError, match="none of the encoders no_such_encoder"):
        video_io.write_mp4(clip, tmp_path / "none.mp4")
    assert not list(tmp_path.glob(".none*"))  # nothing half-written is left
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    with pytest.raises(video_io.InputFileError, match="bad.mp4 is not a video"):
        video_io.read_video(tmp_path / "bad.mp4")


def test_strip_and_animated_png_are_exact(tmp_path):
    from PIL import Image, ImageSequence

    clip = moving_gradient(9, 8, 10)
    assert video_io.strip_indices(9) == [0, 3, 5, 8] and video_io.strip_indices(3) == [0, 1, 2]
    strip = np.asarray(Image.open(video_io.write_strip_png(clip, tmp_path / "s.png")))
    hwc = clip.permute(0, 2, 3, 1).numpy()
    assert strip.shape == (8, 4 * 10 + 3 * 2, 3)
    for k, i in enumerate([0, 3, 5, 8]):
        assert np.array_equal(strip[:, k * 12:k * 12 + 10], hwc[i])
    assert (strip[:, 10:12] == 255).all()
    frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(Image.open(
        video_io.write_apng(clip, tmp_path / "a.png", fps=8)))]
    assert len(frames) == 9 and all(np.array_equal(f, h) for f, h in zip(frames, hwc))
    tiled = video_io.tile_clips(torch.stack([clip, clip.flip(0)]))
    assert tiled.shape == (9, 8, 20, 3) and np.array_equal(tiled[0, :, 10:], hwc[8])
    with pytest.raises(ValueError, match="ambiguous"):
        video_io.frames_hwc(np.zeros((2, 3, 4, 3), np.uint8))


def test_without_av_the_error_names_the_extra(monkeypatch, tmp_path):
    from fastvideo.utils import MissingExtraError

    monkeypatch.setitem(sys.modules, "av", None)  # `import av` raises ImportError, as without the extra
    with pytest.raises(MissingExtraError, match=r"pip install 'flux-grpo\[video\]'"):
        video_io.write_mp4(np.zeros((1, 2, 2, 3), np.uint8), tmp_path / "x.mp4")
    assert not list(tmp_path.iterdir())
