"""The current-line families' bad input through the entry points' own main (training, preprocessing):
each of FLUX.2 [klein], FLUX.2 [dev] and Z-Image exits 2 with ONE line and no traceback, before any
model loads, for embeddings made for another family (FLUX.1's, or the other current-line family's)
and for a model folder whose text encoder is missing; a step-distilled klein asked for guidance
above 1 too. The current library line only (skipped on the recipe line, saying so)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from helpers import train_args  # noqa: E402
from one_line import one_line  # noqa: E402


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "the FLUX.2 and Z-Image families")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")
# family -> (flag value, model fixture, its embeddings fixture, foreign embeddings fixture, the family those name)
FAMILIES = {"klein": ("flux2", "tiny_flux2_dir", "flux2_embeddings", "zimage_embeddings", "zimage"),
            "dev": ("flux2", "tiny_flux2_dev_dir", "flux2_dev_embeddings", "zimage_embeddings", "zimage"),
            "zimage": ("zimage", "tiny_zimage_dir", "zimage_embeddings", "flux2_dev_embeddings", "flux2")}


@pytest.fixture
def no_model_loads(monkeypatch):
    """Every family's loaders record a call instead of loading (the text encoders' after the folder
    check the families' load_text_encoders makes): the refusal must come first."""
    from fastvideo.models import qwen3_text
    from fastvideo.models.flux2 import mistral_text
    from fastvideo.models.flux2.family import Flux2Family
    from fastvideo.models.zimage.family import ZImageFamily

    loaded = []
    for cls in (Flux2Family, ZImageFamily):
        for name in ("load_transformer", "load_vae"):
            monkeypatch.setattr(cls, name, lambda *a, _n=name, **k: loaded.append(_n))
    for module in (qwen3_text, mistral_text):
        monkeypatch.setattr(module, "load_text_encoder", lambda *a, **k: loaded.append("text_encoder"))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    return loaded


def _train(request, tmp_path, model, emb, family, **more):
    from fastvideo.train_grpo_flux import main

    argv = train_args(str(request.getfixturevalue(emb)) if not isinstance(emb, Path) else str(emb), str(model),
                      tmp_path / "out", model_family=family, fsdp_sharding_strategy="none", max_train_steps=1, **more)
    return lambda: main(argv)


@pytest.mark.parametrize("variant", sorted(FAMILIES))
def test_flux1_embeddings_are_named_before_any_model_loads(variant, request, tiny_embeddings, tmp_path, capsys):
    family, model, _, _, _ = FAMILIES[variant]
    run = _train(request, tmp_path, request.getfixturevalue(model), Path(tiny_embeddings), family, guidance_scale=1.0)
    no_model_loads = request.getfixturevalue("no_model_loads")  # after the fixtures that load models
    line = one_line(capsys, run)
    assert "model family 'flux'" in line and f"--model_family {family}" in line and no_model_loads == []


@pytest.mark.parametrize("variant", sorted(FAMILIES))
def test_the_other_current_line_familys_embeddings_are_named(variant, request, tmp_path, capsys):
    family, model, _, foreign, named = FAMILIES[variant]
    run = _train(request, tmp_path, request.getfixturevalue(model), foreign, family, guidance_scale=1.0)
    no_model_loads = request.getfixturevalue("no_model_loads")
    line = one_line(capsys, run)
    assert f"model family {named!r}" in line and no_model_loads == []


@pytest.mark.parametrize("variant", sorted(FAMILIES))
def test_a_folder_without_its_text_encoder_is_named(variant, request, tmp_path, capsys):
    """Training (the folder check names it before anything loads) and preprocessing (which needs it)."""
    from fastvideo.data_preprocess.preprocess_flux_embedding import cli

    family, model, emb, _, _ = FAMILIES[variant]
    broken = shutil.copytree(request.getfixturevalue(model), tmp_path / "broken")
    shutil.rmtree(broken / "text_encoder")
    run = _train(request, tmp_path, broken, emb, family, guidance_scale=1.0)
    no_model_loads = request.getfixturevalue("no_model_loads")
    line = one_line(capsys, run)
    assert "text_encoder/" in line and no_model_loads == []
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube\n")
    line = one_line(capsys, lambda: cli(["--model_path", str(broken), "--prompt_path", str(prompts), "--output_dir",
                                          str(tmp_path / "emb"), "--model_family", family]))
    assert "text_encoder/" in line and no_model_loads == []


def test_a_distilled_klein_with_guidance_is_refused_and_dev_takes_any_scale(request, tiny_flux2_dir,
                                                                           tiny_flux2_dev_dir, flux2_embeddings,
                                                                           tmp_path, capsys, no_model_loads):
    """klein is_distilled with --guidance_scale 3.5 (the CLI default): one line with the fix. dev at
    3.5: the scale is its guidance embedding's, nothing to refuse (the run gets past the folder check
    to the loaders, which record instead of loading)."""
    distilled = shutil.copytree(tiny_flux2_dir, tmp_path / "distilled")
    index = json.loads((distilled / "model_index.json").read_text())
    (distilled / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    line = one_line(capsys, _train(request, tmp_path, distilled, "flux2_embeddings", "flux2", guidance_scale=3.5))
    assert "step-distilled" in line and "--guidance_scale 1" in line and no_model_loads == []
    from fastvideo.models.flux2.family import Flux2Family

    family = Flux2Family(guidance_scale=3.5)
    family.check_folder(tiny_flux2_dev_dir)
    assert family.variant == "dev" and family.velocity_passes == 1
