"""--sp_size 2 through the trainer on 2 gloo ranks for the current library line's families, against
one rank without sequence parallelism (as tests/training/test_sequence_parallel_training.py does for
FLUX.1 and SD3.5): 3 iterations with the same rollout latents and log-probabilities (the run
record's tensors), the same per-iteration rewards, losses and pre-clip gradient norms and the same
weights after them, all to 1e-5 relative. Classifier-free guidance is on, so each forward carries
the prompt's and the empty prompt's captions (Z-Image: captions of unequal length, its mask);
Qwen-Image-Edit splits its generated and source tokens together; Wan its video tokens (Wan2.1-I2V
its tokens of the latents and the first frame's condition, concatenated on channels)."""

from __future__ import annotations

import pytest

from current_line_helpers import line_reason
from helpers import train_args
from test_qwen_image_edit_training import edit_dir, edit_embeddings  # noqa: F401  (fixtures)
from test_wan_i2v_training import i2v_embeddings  # noqa: F401  (fixture)
from test_sequence_parallel_training import _check_parity, _runs

pytestmark = pytest.mark.skipif(line_reason("the current line's families") is not None,
                                reason=line_reason("the current line's families") or "")


def _family_runs(tmp_path, model, index, **family_flags):
    def argv_for(out, flags):
        return train_args(index, model, out, **family_flags, **flags)

    one, two = _runs(tmp_path, argv_for)
    _check_parity(tmp_path, one, two)


@pytest.mark.slow
def test_zimage_sp2_equals_one_rank(tiny_zimage_dir, zimage_embeddings, tmp_path):
    _family_runs(tmp_path, tiny_zimage_dir, zimage_embeddings, model_family="zimage", guidance_scale=4.0,
                 no_quantize_timestep=True)


@pytest.mark.slow
def test_flux2_klein_sp2_equals_one_rank(tiny_flux2_dir, flux2_embeddings, tmp_path):
    _family_runs(tmp_path, tiny_flux2_dir, flux2_embeddings, model_family="flux2", guidance_scale=4.0)


@pytest.mark.slow
def test_qwen_image_sp2_equals_one_rank(tiny_qwen_image_dir, qwen_image_embeddings, tmp_path):
    _family_runs(tmp_path, tiny_qwen_image_dir, qwen_image_embeddings, model_family="qwen_image", guidance_scale=4.0)


@pytest.mark.slow
def test_flux2_dev_sp2_equals_one_rank(tiny_flux2_dev_dir, flux2_dev_embeddings, tmp_path):
    """FLUX.2 [dev]: the guidance embedding in one pass, Mistral-3's 144-token text stream replicated."""
    _family_runs(tmp_path, tiny_flux2_dev_dir, flux2_dev_embeddings, model_family="flux2", guidance_scale=4.0)


@pytest.mark.slow
def test_qwen_image_edit_sp2_equals_one_rank(edit_dir, edit_embeddings, tmp_path):
    """Qwen-Image-Edit: the 4 generated and 16 source tokens (64^2 VAE-area sources) split together,
    true CFG on (the instruction's and the negative's text streams, each with its source image)."""
    _family_runs(tmp_path, edit_dir, edit_embeddings, model_family="qwen_image_edit", guidance_scale=4.0)


@pytest.mark.slow
def test_wan_sp2_equals_one_rank(tiny_wan_dir, wan_embeddings, tmp_path):
    """Wan2.1-T2V, 5-frame clips (2 latent frames x 2 x 2 tokens after the 1x2x2 patches, split over
    the frames), CFG 5.0 with the negative prompt's umT5 tokens replicated."""
    _family_runs(tmp_path, tiny_wan_dir, wan_embeddings, model_family="wan", num_frames=5, guidance_scale=5.0,
                 no_quantize_timestep=True)


@pytest.mark.slow
def test_wan_i2v_sp2_equals_one_rank(tiny_wan_i2v_dir, i2v_embeddings, tmp_path):  # noqa: F811
    """Wan2.1-I2V, 5-frame 64x64 clips from the bundled first frames (2 latent frames x 4 x 4 tokens
    after the patch embedding of [latents ; mask ; first frame's latents], split over the frames), CFG
    5.0: the cross-attention's CLIP image tokens and umT5 tokens replicated on both ranks."""
    _family_runs(tmp_path, tiny_wan_i2v_dir, i2v_embeddings, model_family="wan_i2v", num_frames=5, h=64, w=64,
                 guidance_scale=5.0, no_quantize_timestep=True)
