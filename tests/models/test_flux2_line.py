"""The current-line families (FLUX.2 [klein], Z-Image) on both library lines: registered everywhere,
importable without diffusers' or transformers' FLUX.2 / Z-Image / Qwen3 classes (the recipe line has
none), and refused on the recipe line with one line naming the line and `bash env_setup.sh --line
current` (exit 2) by every entry point that looks a family up: the registry, the training
preflight, preprocessing and the tiny builders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fastvideo import library_lines
from fastvideo.library_lines import RECIPE, LibraryLineError, library_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def as_recipe(monkeypatch):
    """This environment seen as the recipe line (the refusal is tested on both lines)."""
    monkeypatch.setattr(library_lines, "library_line", lambda: RECIPE)


CURRENT_LINE_FAMILIES = [("flux2", "Flux2Transformer2DModel", "make_tiny_flux2"),
                         ("zimage", "ZImageTransformer2DModel", "make_tiny_zimage"),
                         ("qwen_image", "QwenImageTransformer2DModel", "make_tiny_qwen_image")]


@pytest.mark.parametrize("name, class_name, builder", CURRENT_LINE_FAMILIES)
def test_registered_on_both_lines_without_importing_their_library_classes(name, class_name, builder):
    code = ("import sys; from fastvideo.models.registry import model_family_names, family_for_class_name; "
            f"assert {name!r} in model_family_names(); "
            f"assert family_for_class_name({class_name!r}) == {name!r}; "
            "print(sorted(m for m in sys.modules if not m.startswith('fastvideo') and "
            "any(k in m for k in ('flux2', 'z_image', 'qwen3', 'qwenimage', 'qwen2_5_vl'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == []  # nothing of diffusers' / transformers' FLUX.2, Z-Image, Qwen-Image or Qwen code


@pytest.mark.parametrize("name", ["flux2", "zimage", "qwen_image"])
def test_the_registry_refuses_them_on_the_recipe_line(as_recipe, name):
    from fastvideo.models.registry import get_model_family

    with pytest.raises(LibraryLineError) as err:
        get_model_family(name)
    text = str(err.value)
    assert "\n" not in text and f"model family {name!r} needs the current line" in text
    assert "`bash env_setup.sh --line current`" in text and "this environment runs the recipe line" in text
    assert get_model_family("sd3").name == "sd3"  # the other families are not affected


def test_the_training_preflight_names_the_line(as_recipe, tmp_path):
    from fastvideo.preflight import check_training

    argv = ["--model_family", "flux2", "--pretrained_model_name_or_path", str(tmp_path / "m"), "--data_json_path",
            str(tmp_path / "x.json"), "--output_dir", str(tmp_path / "o"), "--rewards", "compressibility:1.0"]
    problems = check_training(argv, check_world=False)
    assert any("env_setup.sh --line current" in p and "'flux2'" in p for p in problems), problems


def test_preprocessing_refuses_flux2_on_the_recipe_line(as_recipe, tmp_path):
    from fastvideo.data_preprocess.embeddings import PreprocessConfig

    cfg = PreprocessConfig(model_path=str(tmp_path), prompt_file="p.txt", output_dir=str(tmp_path / "o"),
                           model_family="flux2")
    with pytest.raises(LibraryLineError, match="--line current"):
        cfg.validate()


@pytest.mark.parametrize("builder", ["make_tiny_flux2", "make_tiny_zimage", "make_tiny_qwen_image"])
def test_the_tiny_builders_exit_2_with_one_line_on_the_recipe_line(tmp_path, builder):
    if library_line() != RECIPE:
        pytest.skip(f"runs the builder's command line on the recipe line; this is the {library_line()} line")
    out = subprocess.run([sys.executable, "-m", f"fastvideo.tools.{builder}", str(tmp_path / "t")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and not (tmp_path / "t").exists()
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "`bash env_setup.sh --line current`" in lines[0], out.stderr


def test_an_index_written_for_another_family_is_refused_by_name(tmp_path):
    """Generic (models.base.family_for_json_keys): FLUX.1's videos2caption.json keys given to SD3."""
    import json

    from fastvideo.data.dataset import PromptEmbeddingDataset
    from fastvideo.models.base import EmbeddingDatasetError
    from fastvideo.models.registry import get_model_family

    index = tmp_path / "videos2caption.json"
    flux = get_model_family("flux")
    index.write_text(json.dumps([{k: ("a cat" if k == "caption" else "0.pt") for k in flux.json_keys}]))
    with pytest.raises(EmbeddingDatasetError, match=r"written for model family 'flux'.*--model_family sd3"):
        PromptEmbeddingDataset(index, family=get_model_family("sd3"))
    assert len(PromptEmbeddingDataset(index, family=flux)) == 1


def test_pipeline_shift_is_refused_for_a_family_without_one(tmp_path):
    from fastvideo.config import build_parser, validate_args
    from fastvideo.errors import ConfigError

    argv = ["--pretrained_model_name_or_path", str(tmp_path), "--data_json_path", str(tmp_path / "x.json"),
            "--output_dir", str(tmp_path / "o"), "--rewards", "compressibility:1.0", "--pipeline_shift"]
    with pytest.raises(ConfigError, match="--pipeline_shift: model family 'flux' has no size-dependent schedule"):
        validate_args(build_parser().parse_args(argv))
