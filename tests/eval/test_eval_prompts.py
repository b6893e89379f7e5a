"""The held-out prompt set in assets/ and the overlap check."""

from pathlib import Path

import pytest

from fastvideo.data.prompts import load_prompts
from fastvideo.eval.prompts import EvalPromptError, check_no_overlap, load_eval_prompts
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)

ROOT = Path(__file__).resolve().parents[2]


def test_assets_eval_prompts_are_64_in_four_styles_and_held_out():
    prompts = load_prompts(ROOT / "assets" / "eval_prompts.txt").prompts
    assert len(prompts) == 64 and len(set(prompts)) == 64
    photo, painting, anime, concept = (prompts[i:i + 16] for i in range(0, 64, 16))
    assert all("photo" in p for p in photo)
    assert all("painting" in p or "fresco" in p for p in painting)
    assert all(p.startswith("an anime") for p in anime)
    assert all(p.startswith("concept art") for p in concept)
    for train_file in ("prompts.txt", "prompts_tiny.txt"):
        check_no_overlap(prompts, load_prompts(ROOT / "assets" / train_file).prompts)


def test_overlap_and_duplicates_are_refused():
    with pytest.raises(EvalPromptError, match="1 of 2 evaluation prompts are also training prompts"):
        check_no_overlap(["A  Red fox", "a cat"], ["a red fox", "a dog"])
    with pytest.raises(EvalPromptError, match="duplicate"):
        check_no_overlap(["a cat", "A cat "], ["a dog"])


def test_missing_file_names_the_fix(tmp_path):
    with pytest.raises(EvalPromptError, match="assets/eval_prompts.txt"):
        load_eval_prompts(tmp_path / "none.txt", "m", 32, family=FLUX)


def test_text_file_and_preprocessed_json_give_the_same_embeddings(tiny_flux_dir, tiny_embeddings):
    import torch

    from fastvideo.data.dataset import PromptEmbeddingDataset

    from_json = load_eval_prompts(tiny_embeddings, str(tiny_flux_dir), 32, family=FLUX)
    from_text = load_eval_prompts(ROOT / "assets" / "prompts_tiny.txt", str(tiny_flux_dir), 32, family=FLUX)
    assert from_json.captions == from_text.captions == PromptEmbeddingDataset(tiny_embeddings, family=FLUX).captions
    text, json_ = from_text.cond, from_json.cond
    assert text["prompt_embeds"].shape == (8, 32, json_["prompt_embeds"].shape[2])
    torch.testing.assert_close(text["prompt_embeds"], json_["prompt_embeds"].float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(text["pooled"], json_["pooled"].float(), rtol=1e-5, atol=1e-5)
    assert from_text.dims == from_json.dims == (32, json_["prompt_embeds"].shape[2], json_["pooled"].shape[1])
