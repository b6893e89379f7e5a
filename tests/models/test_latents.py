"""fastvideo.models.latents against diffusers' own pipelines (nobody here wrote them): FLUX.1's
_pack_latents / _unpack_latents / _prepare_latent_image_ids (both library lines), Qwen-Image's and
FLUX.2's packing and ids (the current line), and the VAE normalisations as the pipelines' own source
lines compute them (read from the installed diffusers and run here on the same tensors). Frames:
a [B, C, F, H, W] latent round-trips, and its tokens are the frames' image tokens, frame by frame.
Every comparison is bit for bit (torch.equal): the module only moves elements or repeats the
pipelines' arithmetic."""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch

from fastvideo.models import latents as L


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _pipeline_lines(func, *needles: str) -> list[str]:
    """The assignments in ``func``'s source (a stock pipeline method) that mention any of ``needles``,
    in source order, as runnable statements."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and any(s in ast.unparse(n) for s in needles)]
    return [ast.unparse(n) for n in sorted(found, key=lambda n: n.lineno)]


def _run(lines: list[str], result: str, **names):
    scope = {"torch": torch, **names}
    for line in lines:
        exec(line, scope)  # noqa: S102 (diffusers' own source lines, see _pipeline_lines)
    return scope[result]


def _current_line():
    from fastvideo.library_lines import CURRENT, LibraryLineError, require_line

    try:
        require_line(CURRENT, "diffusers' Qwen-Image / FLUX.2 pipelines")
    except LibraryLineError as exc:
        pytest.skip(str(exc))


# ---------------------------------------------------------------- frames
def test_pack_round_trips_with_frames_and_orders_tokens_frame_by_frame():
    z = _randn(2, 16, 3, 8, 12)
    x = L.pack(z)
    assert x.shape == (2, 3 * 4 * 6, 64)
    assert torch.equal(L.unpack(x, 3, 8, 12), z)
    per_frame = torch.cat([L.pack_image(z[:, :, f]) for f in range(3)], dim=1)
    assert torch.equal(x, per_frame)
    assert torch.equal(L.unpack_image(L.pack_image(z[:, :, 1]), 8, 12), z[:, :, 1])
    with pytest.raises(ValueError, match="tokens do not make 2 frame"):
        L.unpack(x, 2, 8, 12)


def test_patchify_then_tokens_is_pack_and_round_trips():
    z = _randn(2, 8, 2, 6, 4, seed=1)
    p = L.patchify(z)
    assert p.shape == (2, 32, 2, 3, 2)
    assert torch.equal(L.unpatchify(p), z)
    assert torch.equal(L.to_tokens(p), L.pack(z))
    assert torch.equal(L.from_tokens(L.to_tokens(p), 2, 3, 2), p)
    assert torch.equal(L.unpatchify_image(L.patchify(z)[:, :, 0]), z[:, :, 0])
    with pytest.raises(ValueError, match="do not make a 3x3 grid"):
        L.from_tokens(L.to_tokens(p[:, :, 0]), 3, 3)


def test_positions_count_frames_rows_and_columns_in_token_order():
    ids = L.positions(3, 2, 4)
    assert ids.shape == (24, 3)
    z = torch.arange(3 * 4 * 8, dtype=torch.float32).view(1, 1, 3, 4, 8)  # latent cell -> its index
    tokens = L.pack(z)[0, :, 0]  # each token's top-left cell
    f, r, c = ids.long().unbind(-1)
    assert torch.equal(tokens, (f * 32 + 2 * r * 8 + 2 * c).float())
    assert torch.equal(ids[8:16, 1:], L.positions(1, 2, 4)[:, 1:]) and bool((ids[8:16, 0] == 1).all())


# ---------------------------------------------------------------- FLUX.1 (both library lines)
@pytest.mark.parametrize("h,w", [(8, 8), (4, 12)])
def test_image_packing_and_ids_equal_flux_pipeline(h, w):
    from diffusers import FluxPipeline

    z = _randn(2, 16, h, w, seed=2)
    packed = FluxPipeline._pack_latents(z, 2, 16, h, w)
    assert torch.equal(L.pack_image(z), packed)
    assert torch.equal(L.pack(z.unsqueeze(2)), packed)
    assert torch.equal(L.unpack_image(packed, h, w), FluxPipeline._unpack_latents(packed, 8 * h, 8 * w, 8))
    ids = FluxPipeline._prepare_latent_image_ids(2, h // 2, w // 2, "cpu", torch.float32)
    assert torch.equal(L.positions(1, h // 2, w // 2), ids)


def test_scale_shift_equals_the_flux_and_sd3_pipelines_decode():
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    z = _randn(2, 16, 4, 4, seed=3)
    for pipe, shift in ((FluxPipeline, 0.1159), (StableDiffusion3Pipeline, 0.0609)):
        config = {"scaling_factor": 0.3611, "shift_factor": shift}
        fake = SimpleNamespace(vae=SimpleNamespace(config=SimpleNamespace(**config)))
        lines = _pipeline_lines(pipe.__call__, "scaling_factor")
        assert lines, f"{pipe.__name__}.__call__ has no decode line"
        ref = _run(lines, "latents", self=fake, latents=z)
        assert torch.equal(L.denormalize_scale_shift(z, config), ref)
        assert torch.equal(L.denormalize_scale_shift(z, SimpleNamespace(**config)), ref)
    assert torch.equal(L.denormalize_scale_shift(z, {"scaling_factor": 1.5, "shift_factor": None}), z / 1.5 + 0.0)
    back = L.normalize_scale_shift(L.denormalize_scale_shift(z, {"scaling_factor": 0.5, "shift_factor": 0.25}),
                                   {"scaling_factor": 0.5, "shift_factor": 0.25})
    torch.testing.assert_close(back, z, rtol=0, atol=1e-6)  # the inverse (up to rounding)


def test_scale_shift_encode_equals_flux_kontext_pipeline():
    _current_line()
    from diffusers import FluxKontextPipeline

    z = _randn(2, 16, 4, 4, seed=4)
    config = SimpleNamespace(scaling_factor=0.3611, shift_factor=0.1159)
    lines = _pipeline_lines(FluxKontextPipeline._encode_vae_image, "scaling_factor")
    ref = _run(lines, "image_latents", self=SimpleNamespace(vae=SimpleNamespace(config=config)), image_latents=z)
    assert torch.equal(L.normalize_scale_shift(z, config), ref)


# ---------------------------------------------------------------- Qwen-Image (current line)
def _qwen_vae_config(c=16):
    g = torch.Generator().manual_seed(5)
    mean = (torch.randn(c, generator=g) * 0.5).tolist()
    std = (torch.rand(c, generator=g) * 2 + 0.5).tolist()
    return SimpleNamespace(latents_mean=mean, latents_std=std, z_dim=c)


def test_packing_equals_qwen_image_pipeline():
    _current_line()
    from diffusers import QwenImagePipeline

    z = _randn(2, 1, 16, 8, 12, seed=6)  # the pipeline draws [B, 1, C, H, W] noise and packs it
    packed = QwenImagePipeline._pack_latents(z, 2, 16, 8, 12)
    assert torch.equal(L.pack(z.view(2, 16, 1, 8, 12)), packed)
    assert torch.equal(L.unpack(packed, 1, 8, 12), QwenImagePipeline._unpack_latents(packed, 64, 96, 8))


def test_mean_std_equals_qwen_image_decode_and_edit_encode():
    _current_line()
    from diffusers import QwenImageEditPlusPipeline, QwenImagePipeline

    config = _qwen_vae_config()
    z = _randn(2, 16, 1, 4, 6, seed=7)
    fake = SimpleNamespace(vae=SimpleNamespace(config=config), latent_channels=16)
    decode = _pipeline_lines(QwenImagePipeline.__call__, "latents_mean", "latents_std")
    assert len(decode) == 3, decode  # mean, 1 / std, the formula
    ref = _run(decode, "latents", self=fake, latents=z)
    assert torch.equal(L.denormalize_mean_std(z, config.latents_mean, config.latents_std), ref)
    encode = _pipeline_lines(QwenImageEditPlusPipeline._encode_vae_image, "latents_mean", "latents_std")
    ref = _run(encode, "image_latents", self=fake, image_latents=z)
    assert torch.equal(L.normalize_mean_std(z, config.latents_mean, config.latents_std), ref)
    # the statistics broadcast over channel dim 1 of a latent of any rank (F frames or none)
    video = _randn(1, 16, 5, 2, 2, seed=8)
    assert torch.equal(L.denormalize_mean_std(video, config.latents_mean, config.latents_std)[:, :, 3],
                       L.denormalize_mean_std(video[:, :, 3], config.latents_mean, config.latents_std))


# ---------------------------------------------------------------- FLUX.2 (current line)
def test_patches_tokens_and_ids_equal_flux2_pipeline():
    _current_line()
    from diffusers import Flux2Pipeline

    z = _randn(2, 32, 8, 12, seed=9)
    patched = Flux2Pipeline._patchify_latents(z)
    assert torch.equal(L.patchify(z.unsqueeze(2)).squeeze(2), patched)
    assert torch.equal(L.unpatchify_image(patched), Flux2Pipeline._unpatchify_latents(patched))
    tokens = Flux2Pipeline._pack_latents(patched)
    assert torch.equal(L.to_tokens(patched), tokens)
    assert torch.equal(L.pack(z.unsqueeze(2)), tokens)
    ids = Flux2Pipeline._prepare_latent_ids(patched)  # [B, h w, 4] (t, row, column, l)
    assert torch.equal(L.positions(1, 4, 6, dtype=ids.dtype), ids[0, :, :3])
    from fastvideo.models.flux2.components import image_ids

    assert torch.equal(image_ids(4, 6), ids[0])


class _BatchNormVae(torch.nn.Module):
    def __init__(self, channels=128):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(channels, affine=False)
        self.bn.running_mean = torch.randn(channels, generator=torch.Generator().manual_seed(10))
        self.bn.running_var = torch.rand(channels, generator=torch.Generator().manual_seed(11)) + 0.1
        self.config = SimpleNamespace(batch_norm_eps=1e-4)


def test_batch_norm_statistics_equal_flux2_decode_and_encode():
    _current_line()
    from diffusers import Flux2Pipeline

    vae = _BatchNormVae()
    z = _randn(2, 128, 4, 6, seed=12)
    fake = SimpleNamespace(vae=vae)
    decode = _pipeline_lines(Flux2Pipeline.__call__, "latents_bn_")
    ref = _run(decode, "latents", self=fake, latents=z)
    mean, std = L.batch_norm_stats(vae, ndim=4)
    assert torch.equal(L.denormalize_batch_norm(z, mean, std), ref)
    encode = _pipeline_lines(Flux2Pipeline._encode_vae_image, "latents_bn_")
    ref = _run(encode, "image_latents", self=fake, image_latents=z)
    assert torch.equal(L.normalize_batch_norm(z, mean, std), ref)
    mean5, std5 = L.batch_norm_stats(vae)
    assert mean5.shape == std5.shape == (1, 128, 1, 1, 1)
    assert torch.equal(L.denormalize_batch_norm(z.unsqueeze(2), mean5, std5).squeeze(2),
                       L.denormalize_batch_norm(z, mean, std))


def test_image_geometry():
    assert L.latent_hw(64, 48) == (8, 6) and L.token_grid_hw(64, 48) == (4, 3)
    with pytest.raises(ValueError, match="multiple of 16"):
        L.latent_hw(64, 40)
    assert L.vae_scale_factor({"block_out_channels": [128, 256, 512, 512]}) == 8
    assert L.vae_scale_factor(SimpleNamespace(block_out_channels=[96, 192])) == 2
