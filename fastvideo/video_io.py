"""Clips a person can watch: MP4 files in and out, and the PNG forms a page shows (a strip of
frames, an animated PNG).

MP4 goes through PyAV (`av`, the ``video`` extra: `pip install 'flux-grpo[video]'`), whose wheels
bundle FFmpeg on manylinux x86_64 and aarch64 alike, so nothing is built or found on the host.
Every PyAV wheel the supported Pythons resolve to (17.1 for Python 3.10, 18.1 for 3.11, 19.0 for
3.12 and later; x86_64 and aarch64) has FFmpeg's ``libx264`` encoder: clips are H.264 (yuv420p,
the profile browsers play) at a near-lossless CRF; a PyAV built without x264 falls back to
FFmpeg's own MPEG-4 part 2 encoder (``mpeg4``). `av` is imported on first use, never by importing
the package.

Frames are uint8 (or float in [0, 1]) ``[F, 3, H, W]`` or ``[F, H, W, 3]``; ``read_video`` gives
uint8 ``[F, 3, H, W]``, the layout of the project's frame tensors. H.264 4:2:0 needs an even width
and height: odd frames are padded by repeating their last row / column, and the file's comment
records the true size so ``read_video`` crops the padding off again.
"""

from __future__ import annotations

import os
import re
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np

from fastvideo.errors import InputFileError, MissingInputError, UserError

VIDEO_CODECS = ("libx264", "mpeg4")  # first available wins (every PyAV wheel checked has both)
H264_CRF = "12"  # near lossless for H.264 (x264's default is 23)
DEFAULT_FPS = 16  # Wan2.1's frame rate (diffusers' Wan examples export at 16 fps)
STRIP_FRAMES = 4  # frames a strip shows: the first, the last and evenly spaced ones between
_SIZE_TAG = re.compile(r"flux-grpo frame size (\d+)x(\d+)")


class VideoSizeError(UserError, ValueError):
    """A clip larger than the caller's bound (frames or pixels), refused before decoding it."""


def _av():
    from fastvideo.utils import require

    return require("av", "video", "Writing and reading MP4 clips")


def frames_hwc(frames) -> np.ndarray:
    """uint8 [F, H, W, 3] of ``frames`` (torch or numpy; uint8, or float in [0, 1] rounded as
    sampling.images.to_uint8 does; [F, 3, H, W] or [F, H, W, 3])."""
    if hasattr(frames, "detach"):  # a torch tensor
        t = frames.detach().cpu()
        frames = t.float().numpy() if t.dtype.is_floating_point else t.numpy()
    a = np.asarray(frames)
    if a.ndim != 4 or 3 not in (a.shape[1], a.shape[-1]):
        raise ValueError(f"frames must be [F, 3, H, W] or [F, H, W, 3], got {tuple(a.shape)}")
    if a.shape[1] == 3 and a.shape[-1] == 3:
        raise ValueError(f"frames {tuple(a.shape)} are ambiguous: both dimension 1 and the last are 3")
    if a.shape[0] < 1:
        raise ValueError("no frames to write")
    if a.shape[1] == 3:
        a = a.transpose(0, 2, 3, 1)
    if a.dtype != np.uint8:
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"frames must be uint8 or float in [0, 1], got {a.dtype}")
        a = np.round(np.clip(a.astype(np.float32), 0, 1) * 255).astype(np.uint8)
    return np.ascontiguousarray(a)


def video_codec() -> str:
    """The encoder clips are written with: the first of VIDEO_CODECS this PyAV's FFmpeg has."""
    av = _av()
    for name in VIDEO_CODECS:
        try:
            av.codec.Codec(name, "w")
            return name
        except Exception:  # av.codec.codec.UnknownCodecError: not in this build
            continue
    raise MissingInputError(f"this PyAV's FFmpeg has none of the encoders {', '.join(VIDEO_CODECS)}: "
                            "install PyAV's own wheel (pip install --force-reinstall 'av>=17.1')")


def _stream(container, codec: str, fps, width: int, height: int):
    stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    if codec == "libx264":
        stream.options = {"crf": H264_CRF}
    else:  # MPEG-4 part 2 has no CRF: a bit rate of about 2 bits per pixel keeps it near lossless
        stream.bit_rate = max(1_000_000, int(2 * width * height * float(fps)))
    return stream


def write_mp4(frames, path: str | os.PathLike, fps: float = DEFAULT_FPS) -> Path:
    """Write ``frames`` (see frames_hwc) as an MP4 clip at ``fps`` frames a second; atomically (a
    crash leaves the old file or none). Returns the path."""
    av = _av()
    pixels = frames_hwc(frames)
    if not fps or float(fps) <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    f, h, w, _ = pixels.shape
    pad_h, pad_w = h % 2, w % 2
    if pad_h or pad_w:
        pixels = np.pad(pixels, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".mp4")
    os.close(fd)
    try:
        with av.open(tmp, "w", format="mp4", options={"movflags": "+faststart"}) as container:
            container.metadata["comment"] = f"flux-grpo frame size {w}x{h}"
            stream = _stream(container, video_codec(), fps, w + pad_w, h + pad_h)
            for frame in pixels:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode(None))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_video(path: str | os.PathLike, max_frames: int | None = None, max_pixels: int | None = None):
    """uint8 torch tensor [F, 3, H, W] of the clip at ``path`` (its first video stream), cropped to
    the size write_mp4 recorded. ``max_frames`` / ``max_pixels`` (per frame) refuse a larger clip
    from its header, before anything is decoded (VideoSizeError)."""
    import torch

    av = _av()
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"no video file at {path}")
    try:
        container = av.open(str(path))
    except av.error.FFmpegError as exc:
        raise InputFileError(f"{path} is not a video FFmpeg can read ({exc})") from None
    with container:
        if not container.streams.video:
            raise InputFileError(f"{path} has no video stream")
        stream = container.streams.video[0]
        _check_bounds(path, stream, max_frames, max_pixels)
        size = _SIZE_TAG.fullmatch(container.metadata.get("comment", ""))
        w, h = (int(size.group(1)), int(size.group(2))) if size else (stream.width, stream.height)
        frames = []
        for frame in container.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24")[:h, :w])
            if max_frames is not None and len(frames) > max_frames:
                raise VideoSizeError(f"{path} has more than {max_frames} frames (the limit): shorten the clip")
    if not frames:
        raise InputFileError(f"{path} has a video stream but no frame decodes")
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()


def _check_bounds(path: Path, stream, max_frames: int | None, max_pixels: int | None) -> None:
    pixels = stream.width * stream.height
    if max_pixels is not None and pixels > max_pixels:
        raise VideoSizeError(f"{path} is {stream.width}x{stream.height} ({pixels} pixels a frame, the limit is "
                             f"{max_pixels}): resize the clip")
    if max_frames is not None and stream.frames and stream.frames > max_frames:
        raise VideoSizeError(f"{path} has {stream.frames} frames (the limit is {max_frames}): shorten the clip")


def strip_indices(num_frames: int, count: int = STRIP_FRAMES) -> list[int]:
    """``count`` frame indices from the first to the last, evenly spaced (all when fewer)."""
    if num_frames <= count:
        return list(range(num_frames))
    return [round(i * (num_frames - 1) / (count - 1)) for i in range(count)]


def frame_strip(frames, count: int = STRIP_FRAMES, gap: int = 2) -> np.ndarray:
    """uint8 [H, k*W + (k-1)*gap, 3]: ``count`` frames of the clip side by side (strip_indices),
    ``gap`` white columns between them."""
    pixels = frames_hwc(frames)
    chosen = [pixels[i] for i in strip_indices(len(pixels), count)]
    h = chosen[0].shape[0]
    white = np.full((h, gap, 3), 255, np.uint8)
    parts = [chosen[0]]
    for frame in chosen[1:]:
        parts += [white, frame] if gap else [frame]
    return np.concatenate(parts, axis=1)


def write_strip_png(frames, path: str | os.PathLike, count: int = STRIP_FRAMES) -> Path:
    """The clip's frame strip (frame_strip) as a PNG."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(frame_strip(frames, count)).save(path)
    return path


def apng_bytes(frames, fps: float = DEFAULT_FPS) -> bytes:
    """The clip as an animated PNG file's bytes (lossless, looping; a viewer or a reader without
    APNG sees frame 0)."""
    import io

    from PIL import Image

    images = [Image.fromarray(p) for p in frames_hwc(frames)]
    buf = io.BytesIO()
    images[0].save(buf, format="PNG", save_all=True, append_images=images[1:], duration=1000.0 / float(fps), loop=0)
    return buf.getvalue()


def write_apng(frames, path: str | os.PathLike, fps: float = DEFAULT_FPS) -> Path:
    """The clip as an animated PNG (apng_bytes), written atomically."""
    from fastvideo.utils import atomic_write_bytes

    atomic_write_bytes(path, apng_bytes(frames, fps))
    return Path(path)


def tile_clips(clips) -> np.ndarray:
    """uint8 [F, H, W*N, 3]: N clips (torch / numpy [N, F, 3, H, W] or a list of [F, ...]) side by
    side, frame by frame, to watch as one MP4 (an evaluation row)."""
    parts = [frames_hwc(c) for c in clips]
    if len({p.shape for p in parts}) != 1:
        raise ValueError(f"clips to tile differ in shape: {sorted({p.shape for p in parts})}")
    return np.concatenate(parts, axis=2)
