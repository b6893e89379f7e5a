"""Write the tiny editing data set: source images drawn from a seed and JSONL prompt files.

    python -m fastvideo.tools.make_edit_assets [OUT_DIR] [--size 64]

OUT_DIR (default assets/edit) receives ``images/NN.png`` (simple scenes: a coloured shape on a
coloured background, drawn with numpy from a fixed seed, the same bytes every time),
``prompts_edit.jsonl`` (training: {"prompt": instruction, "image": "images/NN.png"}, paths
relative to the file) and ``eval_edit.jsonl`` (held-out instructions on other images). The repository
keeps the output under assets/edit/; tests/tools/test_make_edit_assets.py holds it equal to a fresh run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

COLOURS = {"red": (200, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 200), "yellow": (230, 200, 40),
           "white": (235, 235, 235), "black": (25, 25, 25)}
SHAPES = ("square", "circle", "stripe")
TRAIN = [("red", "square", "blue", "make the square green"), ("green", "circle", "white", "turn the circle blue"),
         ("blue", "stripe", "yellow", "make the stripe red"), ("yellow", "circle", "black", "make the background white"),
         ("white", "square", "green", "turn the square black"), ("black", "stripe", "white", "make the stripe yellow"),
         ("red", "circle", "yellow", "make the circle bigger"), ("blue", "square", "white", "move the square to the left")]
HELD_OUT = [("green", "square", "black", "make the square red"), ("red", "stripe", "blue", "turn the stripe white"),
            ("yellow", "square", "blue", "make the background green"), ("white", "circle", "red", "make the circle blue")]


def draw(colour: str, shape: str, background: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [size, size, 3]: ``shape`` in ``colour`` on ``background``, with a little seeded noise."""
    img = np.empty((size, size, 3), dtype=np.int16)
    img[:] = COLOURS[background]
    yy, xx = np.mgrid[0:size, 0:size]
    c = size // 2
    if shape == "square":
        mask = (abs(yy - c) < size // 4) & (abs(xx - c) < size // 4)
    elif shape == "circle":
        mask = (yy - c) ** 2 + (xx - c) ** 2 < (size // 4) ** 2
    else:
        mask = abs(xx - c) < size // 8
    img[mask] = COLOURS[colour]
    img += rng.integers(-8, 9, size=img.shape, dtype=np.int16)
    return img.clip(0, 255).astype(np.uint8)


def write_set(out: Path, name: str, rows, first: int, size: int, rng) -> Path:
    from PIL import Image

    lines = []
    for i, (colour, shape, background, instruction) in enumerate(rows, first):
        rel = f"images/{i:02d}.png"
        Image.fromarray(draw(colour, shape, background, size, rng), mode="RGB").save(out / rel, optimize=False)
        lines.append(json.dumps({"prompt": instruction, "image": rel}))
    path = out / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_edit_assets(out_dir: str | Path = "assets/edit", size: int = 64, seed: int = 0) -> Path:
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    write_set(out, "prompts_edit.jsonl", TRAIN, 0, size, rng)
    write_set(out, "eval_edit.jsonl", HELD_OUT, len(TRAIN), size, rng)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="assets/edit")
    ap.add_argument("--size", type=int, default=64, help="image side in pixels, a multiple of 16 (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.size < 16 or a.size % 16:
        ap.error(f"--size {a.size}: the image side must be a positive multiple of 16 (the VAE and the 2x2 packing need it), e.g. 64")
    print(f"wrote {make_edit_assets(a.out_dir, a.size, a.seed)}")


if __name__ == "__main__":
    main()
