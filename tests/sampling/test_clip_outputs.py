"""Where samples and grids are written, a video family's frames [B, F, 3, H, W] (synthetic here)
become MP4 clips and frame-strip PNGs; F == 1 writes exactly today's images."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

av = pytest.importorskip("av")

from fastvideo import video_io  # noqa: E402
from fastvideo.sampling.images import save_group_grids, save_images, to_uint8  # noqa: E402

MAX_MEAN_ABS_ERROR = 3.0  # H.264 at CRF 12 (tests/test_video_io.py)


def clips(b: int, f: int, h: int = 16, w: int = 24) -> torch.Tensor:
    """[B, F, 3, H, W] in [0, 1]: smooth waves, a phase per sample and per frame."""
    t = torch.arange(f).view(1, f, 1, 1, 1).float()
    s = torch.arange(b).view(b, 1, 1, 1, 1).float()
    c = torch.arange(3).view(1, 1, 3, 1, 1).float()
    y = torch.arange(h).view(1, 1, 1, h, 1).float()
    x = torch.arange(w).view(1, 1, 1, 1, w).float()
    return 0.5 + 0.35 * torch.sin((x + 7 * t + 11 * s) / 13 + c) * torch.cos((y - 3 * t) / 17)


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().mean().item()


def test_samples_are_clips_and_one_frame_stays_an_image(tmp_path):
    from fastvideo.training.hooks import ImageSaverHook, IterationResult

    video = clips(4, 5)
    trainer = SimpleNamespace(dims=SimpleNamespace(sp_rank=0, dp_rank=1), family=SimpleNamespace(video_fps=24))
    result = IterationResult(3, SimpleNamespace(images=video, captions=["a", "b"]),
                             SimpleNamespace(total=torch.tensor([0.1, 0.2, 0.3, 0.4])), torch.zeros(4), {})
    ImageSaverHook(1, str(tmp_path), 2).on_iteration_end(trainer, result)
    folder = tmp_path / "images" / "step_000003"
    assert sorted(p.name for p in folder.iterdir()) == [
        "clip_1_0.mp4", "clip_1_1.mp4", "clip_1_2.mp4", "clip_1_3.mp4", "group_1_0.png", "group_1_1.png"]
    frames = (video * 255).round().to(torch.uint8)
    for idx in range(4):
        back = video_io.read_video(folder / f"clip_1_{idx}.mp4")
        assert tuple(back.shape) == (5, 3, 16, 24)  # the trained frame count and size
        assert _error(back, frames[idx]) < MAX_MEAN_ABS_ERROR < _error(back, frames[idx].flip(0))
    with av.open(str(folder / "clip_1_0.mp4")) as c:
        assert c.streams.video[0].average_rate == 24  # the family's frame rate
    # the group grid's cells are the clips' frame strips (frames 0, 1, 3, 4 of 5), exactly
    grid = np.asarray(Image.open(folder / "group_1_1.png"))
    top = grid.shape[0] - 16 - 14
    strip_w = 4 * 24 + 3 * 2
    assert grid.shape[1] == 2 * strip_w
    assert np.array_equal(grid[top:top + 16, strip_w:], video_io.frame_strip(video[3]))
    assert np.array_equal(grid[top:top + 16, strip_w + 3 * 26:strip_w + 3 * 26 + 24],
                          to_uint8(video[3, 4:5])[0].numpy())

    # F == 1 ([B, 1, 3, H, W]): the PNG files of the images [B, 3, H, W], byte for byte
    one = clips(4, 1)
    a = save_images(one, tmp_path / "a", 0) + save_group_grids(one, torch.arange(4.0), 2, tmp_path / "a", 0)
    b = save_images(one[:, 0], tmp_path / "b", 0) + save_group_grids(one[:, 0], torch.arange(4.0), 2, tmp_path / "b", 0)
    assert [p.name for p in a] == [p.name for p in b] == ["flux_0_0.png", "flux_0_1.png", "flux_0_2.png",
                                                          "flux_0_3.png", "group_0_0.png", "group_0_1.png"]
    assert all(p.read_bytes() == q.read_bytes() for p, q in zip(a, b))


def test_evaluation_rows_and_grids_of_clips(tmp_path, monkeypatch):
    from fastvideo.eval import core, report
    from fastvideo.eval.grid import clip_grid_mp4, labelled_grid

    # evaluate() keeps image 0 of each grid prompt shaped as the decoded samples: [G, F, 3, H, W]
    video = clips(6, 5)  # prompt p, image k -> video[2 * p + k]
    monkeypatch.setattr(core, "sample_images", lambda *a, **k: torch.stack([video[2 * p + i] for p, i in a[3]]))
    cond = SimpleNamespace(select=lambda rows: rows)
    prompts = type("P", (), {"captions": ["p0", "p1", "p2"], "cond": cond, "__len__": lambda self: 3})()
    family = SimpleNamespace(source_images=lambda cond: None)
    s = core.SampleSettings(height=16, width=24, steps=1, eta=0.0, shift=1.0, batch_size=4, num_images_per_prompt=2)
    mean = lambda images, captions: images.flatten(1).mean(1)  # noqa: E731
    result = core.evaluate(None, None, prompts, {"mean": mean}, None, s, "cpu", grid_prompts=2, family=family)
    assert torch.equal(result.grid, video[[0, 2]])
    torch.testing.assert_close(result.scores["mean"], video.flatten(1).mean(1).double().view(3, 2))

    row = report.save_row(result.grid, tmp_path / "rows" / "row_000004.png", fps=8)
    strips = np.asarray(Image.open(row))
    assert np.array_equal(strips[:, :102], video_io.frame_strip(video[0]))
    assert np.array_equal(strips[:, 102:], video_io.frame_strip(video[2]))
    back = video_io.read_video(row.with_suffix(".mp4"))  # the row's clips side by side
    assert tuple(back.shape) == (5, 3, 16, 48)
    frames = (video * 255).round().to(torch.uint8)
    assert _error(back[..., 24:], frames[2]) < MAX_MEAN_ABS_ERROR < _error(back[..., 24:], frames[0])

    page = labelled_grid([("base", video[[0, 2]], [["s 1"], ["s 2"]]), ("trained", video[[1, 3]], [[], []])],
                         ["p0", "p1"], tmp_path / "grid_00.png")
    assert Image.open(page).width > 2 * 2 * 102  # two strip columns, each enlarged to at least 160 px a frame
    mp4 = clip_grid_mp4([video[[0, 2]], video[[1, 3]]], tmp_path / "grid_00.mp4", fps=8)
    grid_back = video_io.read_video(mp4)
    assert tuple(grid_back.shape) == (5, 3, 32, 48)  # models top to bottom, prompts left to right
    assert _error(grid_back[..., 16:, :24], frames[1]) < MAX_MEAN_ABS_ERROR
    assert clip_grid_mp4([video[[0, 2], 0]], tmp_path / "images.mp4") is None  # images: no MP4
