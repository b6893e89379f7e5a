"""Multi-reference editing prompt files (FLUX.2 [klein]): a JSONL record's "image" as a list of paths,
read as a tuple in order (a list of one is the plain string's path), every reference checked and
encoded, the record's key naming each reference's digest; the one-line refusals (exit 2, before any
model loads) for mixed counts, empty or non-string lists, more references than the family reads, and
an unreadable second reference."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from fastvideo.data.prompts import load_prompts
from fastvideo.data.sources import SourceImageError, load_pixels

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, lines: list[str], name: str = "refs.jsonl") -> Path:
    data = tmp_path / "data"
    if not data.is_dir():
        shutil.copytree(ROOT / "assets" / "edit", data)
    path = data / name
    path.write_text("\n".join(lines) + "\n")
    return path


TWO = ['{"prompt": "put the square on the circle", "image": ["images/00.png", "images/01.png"]}',
       '{"prompt": "swap the colours", "image": ["images/02.png", "images/03.png"]}',
       '{"prompt": "add the stripe", "image": ["images/04.png", "images/05.png"]}']


def test_a_list_of_references_is_read_in_order_checked_and_keyed(tmp_path):
    from fastvideo.data_preprocess.sources import all_images, record_images, record_keys

    path = _write(tmp_path, TWO)
    plist = load_prompts(path, max_prompts=2)
    images = path.parent / "images"
    assert plist.images == [(images / "00.png", images / "01.png"), (images / "02.png", images / "03.png")]
    assert plist.spare_images == [(images / "04.png", images / "05.png")]
    assert all_images(plist) == [images / f"0{i}.png" for i in range(6)]
    assert record_images(plist) == plist.images + plist.spare_images
    pixels = load_pixels(plist.images)
    assert pixels.shape == (2, 2, 3, 64, 64)
    assert torch.equal(pixels[1, 1], load_pixels([images / "03.png"])[0])
    keys = record_keys(plist)
    swapped = _write(tmp_path / "b", [TWO[0].replace('"images/00.png", "images/01.png"',
                                                     '"images/01.png", "images/00.png"')])
    assert keys[0].count(",") == 1 and record_keys(load_prompts(swapped))[0] != keys[0]
    # a list of one is the string's single path: the same record, the same key
    one = load_prompts(_write(tmp_path, ['{"prompt": "x", "image": ["images/00.png"]}'], "one.jsonl"))
    plain = load_prompts(_write(tmp_path, ['{"prompt": "x", "image": "images/00.png"}'], "plain.jsonl"))
    assert one.images == plain.images and record_keys(one) == record_keys(plain)
    assert load_pixels(one.images).shape == (1, 3, 64, 64)


@pytest.mark.parametrize("lines, match", [
    ([TWO[0], '{"prompt": "y", "image": "images/02.png"}'], r"record 1 names 1 reference images but record 0 names 2"),
    (['{"prompt": "x", "image": []}'], r'"image" must be a path string, got an empty list'),
    (['{"prompt": "x", "image": ["images/00.png", 3]}'], r'"image" must be a path string, got a list holding int'),
    (['{"prompt": "x", "image": ["images/00.png", "a\\ud800.png"]}'], r'the "image" string holds a lone UTF-16'),
])
def test_bad_reference_lists_are_one_line(tmp_path, lines, match):
    with pytest.raises(SourceImageError, match=match) as info:
        load_prompts(_write(tmp_path, lines))
    assert "\n" not in str(info.value)


def _cli(model_dir, path, out, family, capsys) -> tuple[int, list[str]]:
    from fastvideo.data_preprocess import preprocess_embeddings

    code = preprocess_embeddings.cli(["--model_path", str(model_dir), "--prompt_dir", str(path), "--output_dir",
                                      str(out), "--model_family", family])
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_single_source_family_refuses_references_before_any_model_loads(tiny_kontext_dir, tmp_path, monkeypatch,
                                                                           capsys):
    from fastvideo.models.kontext.family import KontextFamily

    monkeypatch.setattr(KontextFamily, "load_text_encoders", lambda *a, **k: pytest.fail("a model was loaded"))
    code, err = _cli(tiny_kontext_dir, _write(tmp_path, TWO), tmp_path / "out", "kontext", capsys)
    assert code == 2 and len(err) == 1 and "gives 2 reference images a record but model family 'kontext'" in err[0]


def _not_current() -> str | None:
    from fastvideo.library_lines import CURRENT, LibraryLineError, require_line

    try:
        require_line(CURRENT, "FLUX.2 [klein] editing")
    except LibraryLineError as exc:
        return str(exc)
    return None


@pytest.mark.skipif(_not_current() is not None, reason=_not_current() or "")
def test_klein_refuses_too_many_or_unreadable_references_in_one_line(tiny_flux2_dir, tmp_path, capsys):
    from fastvideo.models.flux2_edit.family import Flux2EditFamily

    many = ", ".join(f'"images/0{i}.png"' for i in range(Flux2EditFamily.max_references + 1))
    code, err = _cli(tiny_flux2_dir, _write(tmp_path / "a", [f'{{"prompt": "x", "image": [{many}]}}']),
                     tmp_path / "o1", "flux2_edit", capsys)
    assert code == 2 and len(err) == 1 and "gives 5 reference images a record" in err[0] and "at most 4" in err[0]
    path = _write(tmp_path / "b", TWO)
    (path.parent / "images" / "03.png").write_bytes(b"not a png")
    code, err = _cli(tiny_flux2_dir, path, tmp_path / "o2", "flux2_edit", capsys)
    assert code == 2 and len(err) == 1 and "03.png' is not a readable image" in err[0], err


@pytest.mark.skipif(_not_current() is not None, reason=_not_current() or "")
def test_klein_evaluation_prompts_read_every_reference_and_show_the_first(tiny_flux2_dir, tmp_path):
    """--eval_prompts as a 2-reference JSONL: encoded at start-up with both references' tokens; the
    grids' source row (family.source_images) is each record's first reference."""
    from fastvideo.eval.prompts import load_eval_prompts
    from fastvideo.models.flux2_edit.family import Flux2EditFamily

    family = Flux2EditFamily()
    path = _write(tmp_path, TWO[:2])
    prompts = load_eval_prompts(path, str(tiny_flux2_dir), 80, family=family)
    assert prompts.cond["image_latents"].shape == (2, 32, 128) and prompts.dims[2:] == (32, 128, 64, 64)
    assert family.reference_count(prompts.cond["source_ids"]) == 2
    images = path.parent / "images"
    assert torch.equal(family.source_images(prompts.cond), load_pixels([images / "00.png", images / "02.png"]))
