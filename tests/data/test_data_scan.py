"""The start-up data scan finds a missing, unreadable or wrong-shaped embedding file before any
model loads, naming the file."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from fastvideo.data.dataset import PromptEmbeddingDataset
from fastvideo.data.scan import scan_embeddings
from fastvideo.models.base import EmbeddingDatasetError, EmbeddingShapeError
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))


@pytest.fixture
def emb(tiny_embeddings, tmp_path):
    """A private copy of the tiny embeddings folder (tests damage it)."""
    root = tmp_path / "emb"
    shutil.copytree(Path(tiny_embeddings).parent, root)
    return root / "videos2caption.json"


def test_a_good_folder_scans_with_its_dims(emb):
    ds = PromptEmbeddingDataset(emb, family=FLUX)
    scan = scan_embeddings(ds)
    assert scan.prompts == len(ds) and scan.files == 3 * len(ds)
    half = scan_embeddings(ds, rank=1, world_size=2)  # a rank checks its share
    assert half.prompts == len(ds) // 2 and half.dims == scan.dims
    assert scan.dims == ds.dims()


def test_upstream_one_row_text_ids_pass(emb):
    ids = emb.parent / "text_ids" / "2.pt"
    torch.save(torch.zeros(3), ids)  # DanceGRPO's own layout
    scan_embeddings(PromptEmbeddingDataset(emb, family=FLUX))


@pytest.mark.parametrize("damage, match", [
    (lambda p: p.unlink(), r"prompt 3: '.*prompt_embed/3.pt' \(named by the embedding index\) is missing"),
    (lambda p: p.write_bytes(b"not a torch file"), r"prompt 3: '.*prompt_embed/3.pt' is not a readable tensor"),
    (lambda p: torch.save({"x": torch.zeros(2)}, p), r"prompt_embed/3.pt' holds a dict"),
])
def test_a_bad_file_is_named(emb, damage, match):
    damage(emb.parent / "prompt_embed" / "3.pt")
    with pytest.raises(EmbeddingDatasetError, match=match):
        scan_embeddings(PromptEmbeddingDataset(emb, family=FLUX))


def test_a_wrong_shape_is_named_with_the_files(emb):
    path = emb.parent / "prompt_embed" / "5.pt"
    t = torch.load(path, weights_only=True)
    torch.save(t[: t.shape[0] // 2].clone(), path)
    with pytest.raises(EmbeddingShapeError, match=r"prompt 5 has .*prompt_embed/5.pt \(16, "):
        scan_embeddings(PromptEmbeddingDataset(emb, family=FLUX))


def test_the_trainer_scans_before_any_model_loads(emb, tiny_flux_dir, tmp_path, monkeypatch):
    from helpers import single_process_trainer, train_args

    from fastvideo.training import builders

    def no_models(*_):
        raise AssertionError("a model was loaded before the data scan")

    monkeypatch.setattr(builders, "build_models", no_models)
    (emb.parent / "pooled_prompt_embeds" / "1.pt").unlink()
    with pytest.raises(EmbeddingDatasetError, match=r"pooled_prompt_embeds/1.pt' \(named by the embedding index\)"):
        single_process_trainer(train_args(emb, tiny_flux_dir, tmp_path / "out"), monkeypatch)
