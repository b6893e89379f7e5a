"""PromptEmbeddingDataset over videos2caption.json (fastvideo.data.dataset)."""

import json

import pytest
import torch

from fastvideo.data.dataset import (
    EmbeddingDatasetError,
    EmbeddingShapeError,
    PromptEmbeddingDataset,
)
from fastvideo.data_preprocess.embeddings import save_prompt_record, write_caption_json
from fastvideo.models.flux import ExpectedDims
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)

L, D, P = 16, 12, 8
CAPTIONS = ["a cat", "a dog", "a red barn in the snow"]


def make_embeddings(root, captions=CAPTIONS, seq=L, width=D, pooled=P, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    tensors = []
    for i in range(len(captions)):
        e = torch.randn(seq, width, generator=g).to(dtype)
        p = torch.randn(pooled, generator=g).to(dtype)
        ids = torch.zeros(seq, 3, dtype=dtype)
        for sub in ("prompt_embed", "pooled_prompt_embeds", "text_ids"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        save_prompt_record(root, i, {"prompt_embeds": e, "pooled": p, "text_ids": ids}, family=FLUX)
        tensors.append((e, p, ids))
    return write_caption_json(root, captions, family=FLUX), tensors


def test_items_shapes_and_values(tmp_path):
    json_path, tensors = make_embeddings(tmp_path, dtype=torch.bfloat16)
    ds = PromptEmbeddingDataset(json_path, expected=ExpectedDims(D, P, L), family=FLUX)
    assert len(ds) == 3 and ds.captions == CAPTIONS and ds.dims() == (L, D, P)
    for i, (e, p, ids) in enumerate(tensors):
        embed, pooled, text_ids, caption = ds[i]
        assert embed.shape == (L, D) and pooled.shape == (P,) and text_ids.shape == (L, 3)
        assert embed.dtype == torch.bfloat16
        assert torch.equal(embed, e) and torch.equal(pooled, p) and torch.equal(text_ids, ids)
        assert caption == CAPTIONS[i]


def test_works_in_a_dataloader(tmp_path):
    json_path, _ = make_embeddings(tmp_path)
    loader = torch.utils.data.DataLoader(PromptEmbeddingDataset(json_path, family=FLUX), batch_size=2)
    batches = list(loader)
    assert [len(b[3]) for b in batches] == [2, 1]
    assert batches[0][0].shape == (2, L, D) and list(batches[0][3]) == CAPTIONS[:2]


def test_width_mismatch_names_the_fix(tmp_path):
    json_path, _ = make_embeddings(tmp_path, width=64)
    config = {"joint_attention_dim": 32, "pooled_projection_dim": P}
    with pytest.raises(EmbeddingShapeError) as err:
        PromptEmbeddingDataset(json_path, expected=config, family=FLUX)
    msg = str(err.value)
    assert "prompt embeddings have width 64 but the transformer expects joint_attention_dim 32" in msg
    assert "another text encoder" in msg and "--model_path" in msg
    ds = PromptEmbeddingDataset(json_path, family=FLUX)  # no check requested: loads fine
    with pytest.raises(EmbeddingShapeError, match="pooled_projection_dim 9"):
        ds.check_against_transformer({"joint_attention_dim": 64, "pooled_projection_dim": 9})
    with pytest.raises(EmbeddingShapeError, match="--max_sequence_length 512"):
        ds.check_against_transformer({"joint_attention_dim": 64, "pooled_projection_dim": P}, max_sequence_length=512)

    class Cfg:  # diffusers' FrozenDict-like attribute access
        joint_attention_dim, pooled_projection_dim = 64, P

    ds.check_against_transformer(Cfg())


@pytest.mark.parametrize("family, hint", [
    ("flux", "bash scripts/preprocess/preprocess_flux_rl_embeddings.sh (it writes data/rl_embeddings/videos2caption.json)"),
    ("sd3", "bash scripts/preprocess/preprocess_sd3_rl_embeddings.sh (it writes data/rl_embeddings_sd3/"),
    ("qwen_image_edit", "preprocess_qwen_image_edit_rl_embeddings.sh (it writes data/rl_embeddings_qwen_image_edit/"),
    ("toy", "-m fastvideo.data_preprocess.preprocess_embeddings --model_family pkg.module:Name"),
])
def test_the_missing_index_hint_names_the_familys_own_preprocessing(family, hint, tmp_path):
    """Every family used to be told to run FLUX.1's preprocessing launcher."""
    from pathlib import Path

    from fastvideo.data.dataset import preprocess_hint

    assert hint in preprocess_hint(family)
    launcher = preprocess_hint(family).split("bash ")[-1].split(" ")[0]
    assert family == "toy" or (Path(__file__).resolve().parents[2] / launcher).is_file()
    with pytest.raises(EmbeddingDatasetError, match="does not exist: run the preprocessing first") as info:
        PromptEmbeddingDataset(tmp_path / "videos2caption.json", family=type("F", (), {
            "name": family, "json_keys": FLUX.json_keys})())
    assert hint in str(info.value)


def test_missing_index_empty_list_and_bad_entries(tmp_path):
    with pytest.raises(EmbeddingDatasetError, match=r"does not exist: run the preprocessing first"):
        PromptEmbeddingDataset(tmp_path / "videos2caption.json", family=FLUX)
    path = tmp_path / "videos2caption.json"
    path.write_text("[]")
    with pytest.raises(EmbeddingDatasetError, match="holds no prompt"):
        PromptEmbeddingDataset(path, family=FLUX)
    path.write_text("{not json")
    with pytest.raises(EmbeddingDatasetError, match="is not valid JSON"):
        PromptEmbeddingDataset(path, family=FLUX)
    path.write_text(json.dumps([{"caption": "x", "prompt_embed_path": "0.pt"}]))
    with pytest.raises(EmbeddingDatasetError, match="entry 0 .* lacks text_ids, pooled_prompt_embeds_path"):
        PromptEmbeddingDataset(path, family=FLUX)


def test_missing_tensor_file_and_mixed_runs(tmp_path):
    json_path, _ = make_embeddings(tmp_path)
    (tmp_path / "pooled_prompt_embeds" / "1.pt").unlink()
    ds = PromptEmbeddingDataset(json_path, family=FLUX)
    with pytest.raises(EmbeddingDatasetError, match=r"prompt 1: .*1\.pt' is missing; re-run the preprocessing"):
        ds[1]
    torch.save(torch.zeros(P), tmp_path / "pooled_prompt_embeds" / "1.pt")
    torch.save(torch.zeros(L + 1, D), tmp_path / "prompt_embed" / "2.pt")
    ds[0], ds[1]
    with pytest.raises(EmbeddingShapeError, match="mixes two preprocessing runs"):
        ds[2]


def test_reads_dancegrpo_layout_with_one_text_id_row(tmp_path):
    """Upstream saves text_ids[idx] of a [L, 3] tensor, i.e. one [3] row, and repeats it at use."""
    json_path, _ = make_embeddings(tmp_path)
    torch.save(torch.zeros(3), tmp_path / "text_ids" / "0.pt")
    _, _, ids, _ = PromptEmbeddingDataset(json_path, family=FLUX)[0]
    assert ids.shape == (L, 3) and not ids.any()
