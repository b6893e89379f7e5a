"""The evaluator's labelled grid: prompts above the columns, scores under each image."""

from __future__ import annotations

import torch

from fastvideo.eval.grid import MIN_CELL, labelled_grid, wrap


def _dark(im, box) -> int:
    """How many pixels in box (left, top, right, bottom) are clearly not white."""
    return sum(1 for p in im.crop(box).convert("L").getdata() if p < 128)


def test_prompts_and_scores_are_drawn_where_they_belong(tmp_path):
    from PIL import Image, ImageDraw

    from fastvideo.eval.grid import PAD, _font

    images = torch.ones(3, 3, 32, 32)  # white images: any dark pixel in a cell is text
    captions = ["a red cube on a wooden table in the morning light, photographed from above", "a cat", "a dog"]
    rows = [("base", images, [["detail 0.1234", "saturation 0.5"]] * 3),
            ("tuned", images, [["detail 0.2", "saturation 0.6"]] * 3)]
    out = labelled_grid(rows, captions, tmp_path / "g.png")
    im = Image.open(out)
    assert "col 0: a red cube" in im.info["Description"]
    scale = MIN_CELL // 32 + (MIN_CELL % 32 > 0)
    cell = 32 * scale  # 32-pixel images are enlarged to at least MIN_CELL
    font = _font(max(11, cell // 18))
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_h = draw.textbbox((0, 0), "Hg", font=font)[3] + 3
    label_w = draw.textbbox((0, 0), "tuned", font=font)[2] + 2 * PAD
    header_h = len(wrap(draw, captions[0], font, cell - 2 * PAD)) * line_h + 2 * PAD
    row_h = cell + 2 * line_h + 2 * PAD
    assert len(wrap(draw, captions[0], font, cell - 2 * PAD)) > 1  # the long prompt wraps
    assert im.size == (label_w + 3 * (cell + PAD), header_h + 2 * row_h)
    for col in range(3):
        x = label_w + col * (cell + PAD)
        assert _dark(im, (x, 0, x + cell, header_h)) > 10, f"no prompt above column {col}"
        for r in range(2):
            y = header_h + r * row_h
            assert _dark(im, (x, y, x + cell, y + cell)) == 0  # the image itself is untouched
            assert _dark(im, (x, y + cell, x + cell, y + row_h)) > 20, f"no score under row {r} column {col}"
    assert _dark(im, (0, header_h, label_w, header_h + row_h)) > 5  # the row's label


def test_wrap_breaks_at_spaces_and_cuts_with_an_ellipsis():
    from PIL import Image, ImageDraw

    from fastvideo.eval.grid import _font

    draw, font = ImageDraw.Draw(Image.new("RGB", (1, 1))), _font(11)
    lines = wrap(draw, "one two three four five six seven eight nine ten " * 4, font, 60, max_lines=3)
    assert len(lines) == 3 and lines[-1].endswith("...")
    assert all(draw.textbbox((0, 0), line, font=font)[2] <= 60 for line in lines)
    assert wrap(draw, "short", font, 60) == ["short"]
