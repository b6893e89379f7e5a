"""Evaluation of an editing model (python -m fastvideo.tools.evaluate on the tiny FLUX.1 Kontext):
held-out JSONL edit prompts with their source images -> the evaluation rewards get each image's own
source, pixel for pixel, and the grid PNG shows the sources (resized to the generated size) as its
top row. The current library line (Kontext's)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from current_line_helpers import line_reason  # noqa: E402
from edit_helpers import RECORD_ENV, register  # noqa: E402

pytestmark = pytest.mark.skipif(line_reason("FLUX.1 Kontext evaluation") is not None,
                                reason=line_reason("FLUX.1 Kontext evaluation") or "")
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "assets" / "edit" / "eval_edit.jsonl"
H = W = 32


def _source_pixels() -> dict[str, torch.Tensor]:
    """instruction -> its source image [3, h, w] in [0, 1], read from the prompt file's PNG."""
    out = {}
    for line in PROMPTS.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        pixels = np.asarray(Image.open(PROMPTS.parent / record["image"]).convert("RGB"))
        out[record["prompt"]] = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float() / 255.0
    return out


def _grid_origin(labels: list[str], captions: list[str]):
    """(label width, header height, cell size) as fastvideo.eval.grid lays a grid out."""
    from PIL import ImageDraw

    from fastvideo.eval import grid

    scale = max(1, math.ceil(grid.MIN_CELL / W))
    cell = W * scale
    font = grid._font(max(11, cell // 18))
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_h = probe.textbbox((0, 0), "Hg", font=font)[3] + 3
    label_w = max(grid._text_width(probe, label, font) for label in labels) + 2 * grid.PAD
    header_h = max(len(grid.wrap(probe, c, font, cell - 2 * grid.PAD)) for c in captions) * line_h + 2 * grid.PAD
    return label_w, header_h, cell, scale


def test_evaluate_gives_rewards_the_sources_and_draws_them_on_top(tiny_kontext_dir, tiny_rewards, tmp_path,
                                                                  monkeypatch):
    from fastvideo.tools.evaluate import main

    register()
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "record"))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    out = tmp_path / "eval"
    argv = ["--model", f"base={tiny_kontext_dir}", "--model_family", "kontext", "--prompts", str(PROMPTS),
            "--rewards", "record_sources,clip_edit", "--clip_dir", str(tiny_rewards.pickscore_dir),
            "--out", str(out), "--h", str(H), "--w", str(W), "--steps", "2", "--shift", "3", "--seed", "3",
            "--guidance_scale", "2.5", "--num_images_per_prompt", "2", "--batch_size", "3",
            "--max_sequence_length", "32", "--grid_prompts", "4", "--reward_batch_size", "4"]
    assert main(argv) == 0
    expected = _source_pixels()
    calls = [torch.load(p, weights_only=True) for p in sorted((tmp_path / "record").glob("rank0-*.pt"))]
    seen = [(prompt, source) for call in calls for prompt, source in zip(call["prompts"], call["sources"])]
    assert sorted(p for p, _ in seen) == sorted(p for p in expected for _ in range(2))  # 4 prompts x 2 images
    for prompt, source in seen:  # each image's own source, pixel for pixel
        assert torch.equal(source, expected[prompt]), prompt
    scores = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert len(scores) == 8 and all(math.isfinite(s["scores"]["clip_edit"]) for s in scores)

    captions = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()]
    canvas = np.asarray(Image.open(out / "grid_00.png").convert("RGB"))
    label_w, header_h, cell, scale = _grid_origin(["source", "base"], captions)
    sources = torch.stack([expected[c] for c in captions])
    shown = F.interpolate(sources, size=(H, W), mode="bilinear").clamp(0, 1)
    shown = (shown * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    for col in range(len(captions)):
        x = label_w + col * (cell + 4)
        top = canvas[header_h:header_h + cell, x:x + cell]
        assert np.array_equal(top, shown[col].repeat(scale, 0).repeat(scale, 1)), col
        below = canvas[header_h + cell:, x:x + cell]  # the base model's edit is not the source
        assert not any(np.array_equal(below[y:y + cell], top) for y in range(0, below.shape[0] - cell + 1, 1))
