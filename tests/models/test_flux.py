import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from fastvideo.models import flux
from fastvideo.tools.make_tiny_flux import make_tiny_flux


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def test_tiny_folder_small_and_seeded(tiny_flux_dir, tmp_path):
    size = sum(f.stat().st_size for f in Path(tiny_flux_dir).rglob("*") if f.is_file())
    assert size < 5e6
    again = make_tiny_flux(tmp_path / "again", seed=0)
    other = make_tiny_flux(tmp_path / "other", seed=1)
    assert _digest(again) == _digest(tiny_flux_dir)
    assert _digest(other) != _digest(tiny_flux_dir)


def test_tiny_text_encoder_has_the_published_weight_names(tiny_flux_dir):
    """FLUX.1-dev's text_encoder names its weights text_model.* (transformers 5 saves them without the
    prefix, which transformers 4.x cannot read); both lines load the folder's CLIP completely."""
    from safetensors.torch import load_file
    from transformers import CLIPTextModel

    (weights,) = (tiny_flux_dir / "text_encoder").glob("*.safetensors")
    names = load_file(weights).keys()
    assert names and all(k.startswith("text_model.") for k in names)
    model, info = CLIPTextModel.from_pretrained(tiny_flux_dir / "text_encoder", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state = {k.removeprefix("text_model."): v for k, v in model.state_dict().items()}
    saved = {k.removeprefix("text_model."): v for k, v in load_file(weights).items()}
    assert state.keys() == saved.keys() and all(torch.equal(state[k], saved[k]) for k in saved)


def test_stock_flux_pipeline_loads_tiny_folder(tiny_flux_dir):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_flux_dir)
    out = pipe("a red cube on a table", height=64, width=64, num_inference_steps=2,
               generator=torch.Generator().manual_seed(0), output_type="pt").images
    assert out.shape == (1, 3, 64, 64)
    assert torch.isfinite(out).all() and out.std() > 0


def test_helpers_match_flux_pipeline(tiny_flux_dir):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_flux_dir)
    lat = torch.randn(2, 16, 8, 12)
    packed = flux.pack_latents(lat)
    ref = pipe._pack_latents(lat, 2, 16, 8, 12)
    assert torch.equal(packed, ref)
    assert torch.equal(flux.unpack_latents(packed, 8, 12), lat)
    ref_ids = pipe._prepare_latent_image_ids(2, 8 // 2, 12 // 2, "cpu", torch.float32)
    assert torch.equal(flux.image_ids(8, 12), ref_ids)
    assert flux.image_ids(90, 90).shape == (2025, 3)
    assert flux.latent_hw(720, 720) == (90, 90)
    with pytest.raises(ValueError, match="multiple of 16"):
        flux.latent_hw(100, 64)

    enc = flux.load_text_encoders(tiny_flux_dir)
    prompts = ["a cat", "two dogs playing in the snow"]
    emb, pooled, tids = flux.encode_prompts(enc, prompts, max_sequence_length=64)
    # Without autograd, as FluxPipeline.__call__ runs it: the pipeline's encoders keep trainable
    # parameters, and recording a graph makes CPU SDPA (transformers 5's T5 attention) take another kernel.
    with torch.no_grad():
        ref_emb, ref_pooled, ref_tids = pipe.encode_prompt(prompts, None, max_sequence_length=64)
    assert torch.allclose(emb, ref_emb) and torch.allclose(pooled, ref_pooled)
    assert emb.shape == (2, 64, 32) and pooled.shape == (2, 32) and torch.equal(tids, ref_tids)
    assert not torch.allclose(emb[0], emb[1])


def test_decode_matches_pipeline_unnormalisation(tiny_flux_dir):
    vae = flux.load_vae(tiny_flux_dir)
    lat = torch.randn(1, 16, 8, 8)
    z = lat / vae.config.scaling_factor + vae.config.shift_factor
    ref = (vae.decode(z).sample / 2 + 0.5).clamp(0, 1)
    ours = flux.decode_latents(vae, flux.pack_latents(lat), 8, 8)
    assert ours.shape == (1, 3, 64, 64)
    assert torch.allclose(ours, ref, atol=1e-6)
    assert flux.vae_scale_factor(vae.config) == 8


def test_loader_errors(tiny_flux_dir, tmp_path):
    with pytest.raises(flux.FluxFolderError, match="does not exist.*make_tiny_flux"):
        flux.load_transformer(tmp_path / "nope")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_flux_dir, broken)
    shutil.rmtree(broken / "vae")
    for f in (broken / "transformer").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(flux.FluxFolderError, match=r"transformer/<weights.*vae/"):
        flux.check_flux_folder(broken)
    t = flux.load_transformer(tiny_flux_dir)
    assert next(t.parameters()).dtype == torch.float32
