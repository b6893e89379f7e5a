"""A JSONL record's "last_image" (WanImageToVideoPipeline's last_image, image-to-video's last-frame
condition) through preprocessing, the current library line: on Wan2.2-I2V-A14B's tiny folder each stored
condition carries the last frame (the mask one on the first and the last pixel frame; its values equal
the pipeline's in tests/models/test_wan_i2v.py); one line, exit 2, for a last image of another size, for
records that mix "last_image" and none (both before any model loads), for a family that takes no last
frame, and for Wan2.2-TI2V-5B (expand_timesteps: the stock pipeline ignores last_image)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line
from one_line import one_line

FRAMES = 5


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "Wan image-to-video (diffusers' WanImageToVideoPipeline)")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")


def _jsonl(tmp_path, records, name="prompts.jsonl"):
    from pathlib import Path

    images = Path(__file__).resolve().parents[2] / "assets/edit/images"
    for n in ("00.png", "01.png"):
        shutil.copy(images / n, tmp_path / n)
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_last_image_records_preprocess_and_refusals(tiny_wan_i2v_a14b_dir, tiny_wan_ti2v_dir, tmp_path, capsys):
    from PIL import Image

    from fastvideo.data_preprocess.preprocess_embeddings import cli

    def preprocess(model, prompt_file, *extra):
        return lambda: cli(["--model_path", str(model), "--prompt_path", str(prompt_file), "--output_dir",
                            str(tmp_path / "emb"), "--num_frames", str(FRAMES), *extra])

    both = _jsonl(tmp_path, [{"prompt": "a square", "image": "00.png", "last_image": "01.png"},
                             {"prompt": "a circle", "image": "01.png", "last_image": "00.png"}])
    cli(["--model_path", str(tiny_wan_i2v_a14b_dir), "--prompt_path", str(both), "--output_dir",
         str(tmp_path / "ok"), "--num_frames", str(FRAMES)])
    stored = sorted((tmp_path / "ok" / "condition").glob("*.pt"))
    conds = [torch.load(p, weights_only=True) for p in stored]
    assert len(conds) == 2 and all(c.shape == (20, 2, 8, 8) for c in conds)
    for c in conds:  # the mask: the first latent frame given, and the last pixel frame (channel 3 of frame 1)
        assert c[:4, 0].eq(1).all() and c[3, 1].eq(1).all() and c[:3, 1].eq(0).all()
    Image.new("RGB", (32, 64)).save(tmp_path / "small.png")
    odd = _jsonl(tmp_path, [{"prompt": "a square", "image": "00.png", "last_image": "small.png"}], "odd.jsonl")
    line = one_line(capsys, preprocess(tiny_wan_i2v_a14b_dir, odd))
    assert "small.png" in line and "32x64" in line and "one size" in line
    mixed = _jsonl(tmp_path, [{"prompt": "a square", "image": "00.png", "last_image": "01.png"},
                              {"prompt": "a circle", "image": "01.png"}], "mixed.jsonl")
    line = one_line(capsys, preprocess(tiny_wan_i2v_a14b_dir, mixed))
    assert 'give every record a "last_image", or none' in line
    line = one_line(capsys, preprocess(tiny_wan_ti2v_dir, both, "--model_family", "wan_i2v"))
    assert "Wan2.2-TI2V-5B" in line and "remove the \"last_image\" keys" in line
    from fastvideo.data_preprocess.sources import check_prompt_sources
    from fastvideo.errors import ConfigError
    from fastvideo.models.registry import get_model_family

    with pytest.raises(ConfigError, match="'kontext' takes no last frame"):
        check_prompt_sources(str(both), 8, get_model_family("kontext"))
