"""The shared diffusers-family base (fastvideo.models.diffusers_family): what it derives from a family's
attributes is what the families declared by hand before it (stored names, layouts, guidance passes,
blocks), and the text-embedding family's conditioning round-trips through storage. Runs on both
library lines: the family classes import without the current line's diffusers classes."""

from dataclasses import replace

import pytest
import torch

from fastvideo.models import base
from fastvideo.models.diffusers_family import latent_hw
from fastvideo.models.flux.family import FluxFamily
from fastvideo.models.flux2.family import Flux2Family
from fastvideo.models.kontext.family import KontextFamily
from fastvideo.models.qwen_image.family import QwenImageFamily
from fastvideo.models.qwen_image_edit.family import QwenImageEditFamily
from fastvideo.models.sd3.family import SD3Family
from fastvideo.models.zimage.family import ZImageFamily

# Each family's stored tensors (name, videos2caption.json key, folder) as written out at 2548e9a: the
# folders and keys a dataset made before stays readable by.
STORED = {
    SD3Family: [("prompt_embeds", "prompt_embed_path", "prompt_embed"),
                ("pooled", "pooled_prompt_embeds_path", "pooled_prompt_embeds"),
                ("neg_prompt_embeds", "negative_prompt_embed_path", "negative_prompt_embed"),
                ("neg_pooled", "negative_pooled_prompt_embeds_path", "negative_pooled_prompt_embeds")],
    ZImageFamily: [("prompt_embeds", "prompt_embed_path", "prompt_embed"),
                   ("prompt_mask", "prompt_mask_path", "prompt_mask"),
                   ("neg_prompt_embeds", "negative_prompt_embed_path", "negative_prompt_embed"),
                   ("neg_prompt_mask", "negative_prompt_mask_path", "negative_prompt_mask")],
    QwenImageFamily: [("prompt_embeds", "prompt_embed_path", "prompt_embed"),
                      ("prompt_mask", "prompt_embeds_mask_path", "prompt_embeds_mask"),
                      ("neg_prompt_embeds", "negative_prompt_embed_path", "negative_prompt_embed"),
                      ("neg_prompt_mask", "negative_prompt_embeds_mask_path", "negative_prompt_embeds_mask")],
    Flux2Family: [("prompt_embeds", "prompt_embed_path", "prompt_embed"),
                  ("neg_prompt_embeds", "negative_prompt_embed_path", "negative_prompt_embed")],
    KontextFamily: [("prompt_embeds", "prompt_embed_path", "prompt_embed"),
                    ("pooled", "pooled_prompt_embeds_path", "pooled_prompt_embeds"),
                    ("text_ids", "text_ids", "text_ids"),
                    ("image_latents", "image_latents_path", "image_latents"),
                    ("source_ids", "source_ids_path", "source_ids"),
                    ("source_image", "source_image_path", "source_image")],
    QwenImageEditFamily: [("prompt_embeds", "prompt_embed_path", "prompt_embed"),
                          ("prompt_mask", "prompt_embeds_mask_path", "prompt_embeds_mask"),
                          ("neg_prompt_embeds", "negative_prompt_embed_path", "negative_prompt_embed"),
                          ("neg_prompt_mask", "negative_prompt_embeds_mask_path", "negative_prompt_embeds_mask"),
                          ("image_latents", "image_latents_path", "image_latents"),
                          ("source_image", "source_image_path", "source_image"),
                          ("source_grid", "source_grid_path", "source_grid")],
}
JSON_KEYS = {
    KontextFamily: ("prompt_embed_path", "text_ids", "pooled_prompt_embeds_path", "image_latents_path",
                    "source_ids_path", "source_image_path", "caption"),
}


@pytest.mark.parametrize("cls", list(STORED), ids=lambda c: c.name)
def test_stored_names_and_json_keys_are_the_families_own(cls):
    assert [(s.name, s.json_key, s.folder) for s in cls.storage] == STORED[cls]
    expected = JSON_KEYS.get(cls, tuple(key for _, key, _ in STORED[cls]) + ("caption",))
    assert cls.json_keys == expected


# (family, guidance_scale) -> transformer passes per velocity, as each family counted them by hand
PASSES = [(FluxFamily, 3.5, 1), (KontextFamily, 2.5, 1), (SD3Family, 4.5, 2), (SD3Family, 1.0, 1),
          (ZImageFamily, None, 2), (ZImageFamily, 0.0, 1), (ZImageFamily, 0.5, 2), (QwenImageFamily, None, 2),
          (QwenImageFamily, 1.0, 1), (Flux2Family, None, 2), (Flux2Family, 1.0, 1)]


@pytest.mark.parametrize("cls,scale,passes", PASSES, ids=lambda v: getattr(v, "name", str(v)))
def test_guidance_passes_follow_each_pipelines_rule(cls, scale, passes):
    family = cls(guidance_scale=scale)
    assert family.velocity_passes == passes
    pipeline_default = {ZImageFamily: 5.0, QwenImageFamily: 4.0, Flux2Family: 4.0}
    assert family.scale == (pipeline_default[cls] if scale is None else scale)


class _Config(dict):
    """A transformer or VAE config read as attributes (diffusers' FrozenDict-like)."""

    __getattr__ = dict.__getitem__


class _Model:
    def __init__(self, **config):
        self.config = _Config(config)


VAE_KL = _Model(block_out_channels=[1, 2, 3, 4], latent_channels=16)  # 8 pixels per cell
VAE_QWEN = _Model(temperal_downsample=[False, True, True], z_dim=16)


@pytest.mark.parametrize("family,vae,in_channels,tokens,channels", [
    (FluxFamily(), VAE_KL, 64, 4 * 6, 64),  # 2x2-packed tokens, in_channels per token
    (SD3Family(), VAE_KL, 16, 8 * 12, 16),  # one latent cell per token
    (ZImageFamily(), VAE_KL, 16, 4 * 6, 64),  # in_channels per cell, 2x2 cells a token
    (QwenImageFamily(), VAE_QWEN, 64, 4 * 6, 64),
    (Flux2Family(), _Model(block_out_channels=[1, 2, 3, 4], latent_channels=32), 128, 4 * 6, 128),
], ids=["flux", "sd3", "zimage", "qwen_image", "flux2"])
def test_layouts_from_the_vae_the_transformer_and_the_config_agree(family, vae, in_channels, tokens, channels):
    """64 x 96 pixels: an 8 x 12 latent grid; the tokens' channels from the transformer, from the VAE
    alone, and from a config (nominal_layout) are the same."""
    from_vae = family.layout(64, 96, vae)
    from_transformer = family.layout(64, 96, vae, _Model(in_channels=in_channels))
    nominal = family.nominal_layout(64, 96, {"in_channels": in_channels})
    for layout in (from_vae, from_transformer, nominal):
        assert (layout.tokens, layout.latent_hw) == ((tokens, channels), (8, 12))
    if isinstance(family, Flux2Family):  # the token grid and its ids [L, 4]
        assert (nominal["grid_h"], nominal["grid_w"], tuple(nominal["image_ids"].shape)) == (4, 6, (24, 4))
    else:
        assert (nominal["latent_h"], nominal["latent_w"]) == (8, 12)
    if isinstance(family, FluxFamily):
        assert tuple(nominal["image_ids"].shape) == (24, 3)
    with pytest.raises(ValueError, match="image size 72x96 must be a multiple of 16 on both sides"):
        family.nominal_layout(72, 96, {"in_channels": in_channels})
    assert latent_hw(64, 96, 8) == (8, 12)


class _Blocks:
    def __init__(self, **lists):
        self.__dict__.update(lists)


def test_blocks_follow_the_block_lists_through_a_wrapper():
    model = _Blocks(noise_refiner=["n"], context_refiner=["c"], layers=["l1", "l2"])
    wrapped = _Blocks(module=model)
    assert ZImageFamily().blocks(wrapped) == ["n", "c", "l1", "l2"]
    assert FluxFamily().blocks(_Blocks(transformer_blocks=["d"], single_transformer_blocks=["s1", "s2"])) == \
        ["d", "s1", "s2"]


def _fake_encoder(calls, masked):
    def encode(encoders, prompts, max_sequence_length):
        calls.append(list(prompts))
        embeds = torch.stack([torch.full((max_sequence_length, 3), float(len(p))) for p in prompts])
        mask = torch.ones(len(prompts), max_sequence_length)
        return (embeds, mask) if masked else embeds
    return encode


@pytest.mark.parametrize("cls,negative", [(ZImageFamily, ""), (QwenImageFamily, " "), (Flux2Family, "")],
                         ids=["zimage", "qwen_image", "flux2"])
def test_text_conditioning_encodes_the_negative_and_round_trips_through_storage(cls, negative):
    family, calls = cls(), []
    family.parts = replace(family.parts, encode_prompts=_fake_encoder(calls, family.masked))
    cond = family.encode_prompts(None, ("a", "bcd"), 5)
    assert calls == [["a", "bcd"], [negative]]  # the pipeline's negative prompt, encoded once
    family.check_cond(cond)
    assert torch.equal(cond["neg_prompt_embeds"], torch.full((5, 3), float(len(negative))))
    shapes = family.record_shapes(5, {"embed_dim": 3})
    records = []
    for i in range(len(cond)):
        stored = family.stored_record(cond.record(i))
        assert [tuple(stored[s.name].shape) for s in family.storage] == list(shapes)
        records.append(family.check_record(i, stored, None, "here")[0])
    assert family.check_record(1, records[1], (5, 3), "here")[1] == (5, 3)
    back = family.cond_from_tensors(records)
    assert back.to_tensors().keys() == cond.to_tensors().keys()
    assert all(torch.equal(back[k], cond[k]) for k in cond.to_tensors())
    family.check_dims((5, 3), {family.text_width_key: 3}, 5)
    with pytest.raises(base.EmbeddingShapeError, match=f"expects {family.text_width_key} 4: the embeddings were made"):
        family.check_dims((5, 3), {family.text_width_key: 4}, 5)
    assert family.cond_numel({family.text_width_key: 3}, 5) == 5 * (3 + (1 if family.masked else 0))
