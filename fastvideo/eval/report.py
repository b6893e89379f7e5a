"""What an evaluation leaves on disk: eval.jsonl, one grid row per evaluation stacked into
eval_grid.png (same prompts, same noise: drift shows down the columns) and eval_curve.png. A video
family's rows are frame strips, each with its MP4 (eval/rows/row_N.mp4: the row's clips side by side)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fastvideo import utils

ROW_LABEL_W = 56  # pixels left of each grid row for its "it N" label


def read_jsonl(path: str | Path, warn: bool = True) -> list[dict]:
    """eval.jsonl's records (a torn last line dropped, saying so: fastvideo.utils.read_jsonl)."""
    return utils.read_jsonl(path, warn)


def append_jsonl(path: str | Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def truncate_jsonl(path: str | Path, last_iteration: int) -> list[dict]:
    """Keep the records up to ``last_iteration`` (resume); returns them."""
    keep = [r for r in read_jsonl(path) if r.get("iteration", 0) <= last_iteration]
    path = Path(path)
    if path.exists():  # atomically: a crash now leaves the old file or the new one
        utils.atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
    return keep


def row_path(eval_dir: str | Path, iteration: int) -> Path:
    return Path(eval_dir) / "rows" / f"row_{int(iteration):06d}.png"


def save_row(images: torch.Tensor, path: str | Path, fps: float | None = None) -> Path:
    """[G, 3, H, W] in [0, 1] -> one PNG row of G images. Clips [G, F, 3, H, W] (F > 1): the row
    of their frame strips, and beside it (the same name, .mp4) the G clips side by side at ``fps``."""
    from PIL import Image

    from fastvideo.sampling.images import as_images_or_clips, cells_uint8

    pixels = cells_uint8(images)  # [G, h, w, 3]
    row = Image.fromarray(pixels.transpose(1, 0, 2, 3).reshape(pixels.shape[1], -1, 3))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    row.save(path)
    clips, is_clip = as_images_or_clips(images)
    if is_clip:
        from fastvideo.video_io import DEFAULT_FPS, tile_clips, write_mp4

        write_mp4(tile_clips(clips.detach().float().clamp(0, 1).cpu()), path.with_suffix(".mp4"), fps or DEFAULT_FPS)
    return path


def source_cells(sources: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """The source row's cells, aligned with ``grid``'s: sources [G, 3, H, W] as they are above images;
    above clips [G, F, 3, H, W] of the sources' size (image-to-video: the source is the first frame)
    each source starts its clip's frame strip, the strip's other cells white."""
    if grid.ndim != 5 or grid.shape[1] == 1 or tuple(grid.shape[-2:]) != tuple(sources.shape[-2:]):
        return sources
    cells = torch.ones(sources.shape[0], grid.shape[1], *sources.shape[1:], dtype=sources.dtype)
    cells[:, 0] = sources.cpu()
    return cells


def compose_grid(rows: list[tuple[str, Path]], out_png: str | Path, captions: list[str] | None = None) -> Path:
    """Stack labelled rows (label, row PNG) top to bottom into one PNG; captions (one per column)
    are printed as column numbers' legend in the PNG's text chunk, not on the image."""
    from PIL import Image, ImageDraw, PngImagePlugin

    images = [Image.open(p).convert("RGB") for _, p in rows]
    w = max(im.width for im in images)
    h = sum(im.height for im in images)
    canvas = Image.new("RGB", (ROW_LABEL_W + w, h), "white")
    draw = ImageDraw.Draw(canvas)
    y = 0
    for (label, _), im in zip(rows, images):
        canvas.paste(im, (ROW_LABEL_W, y))
        draw.text((3, y + im.height // 2 - 5), label, fill="black")
        y += im.height
    info = PngImagePlugin.PngInfo()
    if captions:
        info.add_text("Description", " | ".join(f"col {i}: {c}" for i, c in enumerate(captions)))
    out_png = Path(out_png)
    canvas.save(out_png, pnginfo=info)
    return out_png


def plot_eval_curve(records: list[dict], out_png: str | Path, guard_reward: str | None = None) -> Path | None:
    """One panel per reward: eval mean +- std per iteration; the guard reward's panel is titled
    as such and evaluations where the guard counted a hacking step are marked with x."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(records[-1]["rewards"])
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.2), squeeze=False)
    its = [r["iteration"] for r in records]
    for ax, name in zip(axes[0], names):
        mean = [r["rewards"].get(name, {}).get("mean", float("nan")) for r in records]
        std = [r["rewards"].get(name, {}).get("std", 0.0) for r in records]
        ax.plot(its, mean, marker="o", ms=3)
        ax.fill_between(its, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
        hacked = [(i, m) for i, m, r in zip(its, mean, records) if r.get("guard", {}).get("hacking")]
        if name == guard_reward and hacked:
            ax.scatter(*zip(*hacked), marker="x", color="tab:red", zorder=3, label="guard: hacking")
            ax.legend(fontsize=7)
        ax.set_title(f"{name} (guard)" if name == guard_reward else name, fontsize=9)
        ax.set_xlabel("iteration")
    fig.suptitle("held-out evaluation (same prompts, same noise)", fontsize=10)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png
