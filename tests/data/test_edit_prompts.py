"""Editing prompt files (fastvideo.data.sources, data_preprocess.sources): JSONL records with source
images resolved against the file's folder, the one-line refusals before any model loads, and the
stored records the kontext family reads back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fastvideo.data.prompts import load_prompts
from fastvideo.data.sources import SourceImageError, check_source_images, load_pixels

ROOT = Path(__file__).resolve().parents[2]
EDIT = ROOT / "assets" / "edit"


def _copy_set(tmp_path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(EDIT, data)
    return data / "prompts_edit.jsonl"


def test_relative_image_paths_resolve_against_the_prompt_file(tmp_path, monkeypatch):
    path = _copy_set(tmp_path)
    monkeypatch.chdir(tmp_path)  # not the file's folder: "images/00.png" must not resolve here
    plist = load_prompts(path)
    assert plist.prompts[0] == "make the square green" and len(plist.prompts) == 8
    assert plist.images[0] == path.parent / "images" / "00.png" and all(p.is_file() for p in plist.images)
    capped = load_prompts(path, max_prompts=3)
    assert len(capped.images) == 3 and capped.spare_images[0].name == "03.png"
    assert check_source_images(plist.images, 16) == (64, 64)


def test_text_files_and_image_free_jsonl_carry_no_images(tmp_path):
    assert load_prompts(ROOT / "assets" / "prompts_tiny.txt").images is None
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "a cat"}\n\n{"prompt": "a dog"}\n')
    plist = load_prompts(path)
    assert plist.prompts == ["a cat", "a dog"] and plist.images is None and plist.num_blank == 1


@pytest.mark.parametrize("content, match", [
    ('{"prompt": "x", "image": "nope.png"}', r"nope\.png' does not exist"),
    ('{"prompt": "x", "image": "bad.png"}', r"bad\.png' is not a readable image"),
    ('{"prompt": "x", "image": "odd.png"}', r"odd\.png' is 40x64: both sides must be multiples of 16"),
    ('{"prompt": "x", "image": "images/00.png"}\n{"prompt": "y", "image": "big.png"}', r"big\.png' is 80x80 but"),
    ('{"prompt": "x", "image": "images/00.png"}\n{"prompt": "y"}', r"record 1 does not"),
    ('{"image": "images/00.png"}', r'line 1 has no "prompt"'),
    ('{"prompt": "x", "image": 3}', r'line 1: "image" must be a path string, got int'),
])
def test_bad_images_are_one_line_naming_the_file(tmp_path, content, match):
    from PIL import Image

    path = _copy_set(tmp_path)
    (path.parent / "bad.png").write_bytes(b"not a png")
    Image.new("RGB", (40, 64)).save(path.parent / "odd.png")
    Image.new("RGB", (80, 80)).save(path.parent / "big.png")
    path.write_text(content + "\n")
    with pytest.raises(SourceImageError, match=match) as info:
        check_source_images(load_prompts(path).images, 16)
    assert "\n" not in str(info.value)


def test_missing_image_is_refused_before_any_model_loads(tiny_kontext_dir, tmp_path, monkeypatch, capsys):
    from fastvideo.data_preprocess import preprocess_embeddings
    from fastvideo.models.kontext.family import KontextFamily

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the prompt file was checked")

    monkeypatch.setattr(KontextFamily, "load_text_encoders", no_load)
    path = _copy_set(tmp_path)
    (path.parent / "images" / "05.png").unlink()
    code = preprocess_embeddings.cli(["--model_path", str(tiny_kontext_dir), "--prompt_dir", str(path),
                                      "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "images/05.png' does not exist" in err[0]
    # a text-to-image prompt file for an editing family, and images for a text-to-image family
    for prompts, family in ((ROOT / "assets/prompts_tiny.txt", "kontext"), (path.parent / "eval_edit.jsonl", "flux")):
        code = preprocess_embeddings.cli(["--model_path", str(tiny_kontext_dir), "--prompt_dir", str(prompts),
                                          "--output_dir", str(tmp_path / "o2"), "--model_family", family])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err


def test_preprocessing_stores_what_kontext_reads_back(tiny_kontext_dir, kontext_embeddings):
    from fastvideo.data.dataset import PromptEmbeddingDataset
    from fastvideo.models.kontext.family import KontextFamily

    family = KontextFamily()
    data = PromptEmbeddingDataset(kontext_embeddings, family=family)
    entries = json.loads(Path(kontext_embeddings).read_text())
    assert entries[3]["caption"] == "make the background white" and len(data) == 8
    cond, captions = data.stack([data[3], data[0]])
    pixels = load_pixels([EDIT / "images" / "03.png", EDIT / "images" / "00.png"])
    assert torch.equal(family.source_images(cond), pixels)  # exact on the CPU (fp32 storage)
    enc = family.load_text_encoders(tiny_kontext_dir)
    again = family.encode_sources(enc, family.encode_prompts(enc, captions, 32), pixels)
    torch.testing.assert_close(cond["image_latents"], again["image_latents"], rtol=1e-6, atol=1e-6)
    assert cond["image_latents"].shape == (2, 16, 64) and cond["source_ids"].shape == (16, 3)
    data.check_against_transformer(json.loads((tiny_kontext_dir / "transformer" / "config.json").read_text()), 32)


def test_a_changed_source_image_is_not_reused(tiny_kontext_dir, tmp_path):
    """The rerun's fingerprint holds each image's bytes: a replaced image makes its prompt stale."""
    from PIL import Image

    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess
    from fastvideo.errors import ConfigError

    path = _copy_set(tmp_path)
    cfg = PreprocessConfig(model_path=str(tiny_kontext_dir), prompt_file=str(path), output_dir=str(tmp_path / "o"),
                           max_sequence_length=16, dataloader_num_workers=0, model_family="kontext", max_prompts=2)
    run_preprocess(cfg)
    Image.new("RGB", (64, 64), (255, 0, 0)).save(path.parent / "images" / "01.png")
    with pytest.raises(ConfigError, match="captions differ.*first: prompt 1"):
        run_preprocess(cfg)


def test_absolute_and_home_paths_stay_where_they_point(tmp_path, monkeypatch):
    from PIL import Image

    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    (elsewhere).mkdir()
    (home / "pics").mkdir(parents=True)
    Image.new("RGB", (16, 16)).save(elsewhere / "a.png")
    Image.new("RGB", (16, 16)).save(home / "pics" / "b.png")
    monkeypatch.setenv("HOME", str(home))
    path = tmp_path / "data" / "p.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps({"prompt": "x", "image": str(elsewhere / "a.png")}) + "\n"
                    + json.dumps({"prompt": "y", "image": "~/pics/b.png"}) + "\n")
    assert load_prompts(path).images == [elsewhere / "a.png", home / "pics" / "b.png"]


def test_load_pixels_is_rgb_over_255_channels_first(tmp_path):
    import numpy as np
    from PIL import Image

    rgb = np.array([[[255, 0, 51], [0, 102, 0]], [[1, 2, 3], [254, 128, 64]]], dtype=np.uint8)  # [H, W, 3]
    Image.fromarray(rgb).save(tmp_path / "a.png")
    Image.fromarray(255 - rgb).save(tmp_path / "b.png")
    pixels = load_pixels([tmp_path / "a.png", tmp_path / "b.png"])
    assert pixels.shape == (2, 3, 2, 2) and pixels.dtype == torch.float32
    assert torch.equal(pixels[0], torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0)
    assert torch.equal(pixels[1], torch.from_numpy(255 - rgb).permute(2, 0, 1).float() / 255.0)
