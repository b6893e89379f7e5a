"""Our HPS scores == the hpsv2 package's own scoring code, on the same (tiny) weights.

The reference side is hpsv2 1.2.0 itself: its bundled open_clip builds the model with the same
arguments as hpsv2.img_score.initialize_model (light_augmentation=True -> its preprocess_val),
loads open_clip_pytorch_model.bin the way DanceGRPO does (pretrained=<path>), and
hpsv2.img_score.score() then loads the HPS 'state_dict', tokenizes and scores -- one image at a
time, as upstream does. Only the architecture name differs (a tiny config registered in both
open_clip registries) so that the test runs in seconds.

Install the reference with scripts/install_hpsv2_parity.sh. Without hpsv2 the test skips, unless
FLUX_GRPO_REQUIRE_PARITY is set (CI), where it must run.
"""

import importlib
import os
import sys
import types
import warnings

import pytest
import torch

pytestmark = pytest.mark.network

LONG_PROMPT = " ".join(["a very long prompt about a castle"] * 20)  # > 77 tokens: truncation
PARITY_PROMPTS = [
    "a red cube on a table",
    "Caf&eacute; at night,   with  ÉLAN!",  # html unescape, ftfy, whitespace, case
    LONG_PROMPT,
    "x",
    "a dog running on a beach",
]
PARITY_SIZES = [(40, 48), (32, 32), (20, 70), (50, 31), (64, 64)]  # h, w


def _import_hpsv2_img_score():
    """hpsv2.img_score, or None if hpsv2 is not installed.

    hpsv2's bundled open_clip has a stray `from turtle import forward`; on a Python built
    without tkinter, stand in for that one name rather than lose the test.
    """
    try:
        import turtle  # noqa: F401
    except ImportError:
        sys.modules["turtle"] = types.SimpleNamespace(forward=None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # timm deprecation noise from hpsv2's open_clip
            return importlib.import_module("hpsv2.img_score")
    except ImportError as exc:
        if os.environ.get("FLUX_GRPO_REQUIRE_PARITY"):
            raise AssertionError(
                "FLUX_GRPO_REQUIRE_PARITY is set but hpsv2 cannot be imported "
                f"({exc}); run scripts/install_hpsv2_parity.sh"
            ) from exc
        return None


@pytest.fixture(scope="module")
def img_score():
    module = _import_hpsv2_img_score()
    if module is None:
        pytest.skip(
            "hpsv2 is not installed (run scripts/install_hpsv2_parity.sh); "
            "set FLUX_GRPO_REQUIRE_PARITY=1 to make this a failure"
        )
    return module


@pytest.fixture(scope="module")
def hpsv2_score(img_score, tiny_rewards, tmp_path_factory):
    """images (8-bit PIL), prompts -> hpsv2's scores, one image at a time as upstream does."""
    from hpsv2.src import open_clip as hpsv2_open_clip

    hpsv2_open_clip.add_model_config(tiny_rewards.hps_model_config)
    folder = tiny_rewards.hps_ckpt_dir
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The exact call of hpsv2.img_score.initialize_model / DanceGRPO, but the tiny name.
        model, _, preprocess_val = hpsv2_open_clip.create_model_and_transforms(
            tiny_rewards.hps_model_name,
            str(folder / "open_clip_pytorch_model.bin"),
            precision="amp",
            device="cpu",
            jit=False,
            force_quick_gelu=False,
            force_custom_text=False,
            force_patch_dropout=False,
            force_image_size=None,
            pretrained_image=False,
            image_mean=None,
            image_std=None,
            light_augmentation=True,
            aug_cfg={},
            output_dict=True,
            with_score_predictor=False,
            with_region_predictor=False,
        )
    root = str(tmp_path_factory.mktemp("hpsv2_root"))

    def score(images, prompts):
        mp = pytest.MonkeyPatch()
        # score() reuses a model already in model_dict instead of building ViT-H-14.
        mp.setitem(img_score.model_dict, "model", model)
        mp.setitem(img_score.model_dict, "preprocess_val", preprocess_val)
        mp.setattr(img_score, "device", "cpu")
        mp.setattr(img_score, "root_path", root)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return torch.tensor([float(img_score.score([im], p, cp=str(folder / "HPS_v2.1_compressed.pt"))[0])
                                     for im, p in zip(images, prompts)])
        finally:
            mp.undo()

    return score


@pytest.fixture(scope="module")
def reference_scores(hpsv2_score, make_pils_module):
    """hpsv2's scores for PARITY_PROMPTS x images of PARITY_SIZES."""
    images = make_pils_module(PARITY_SIZES)
    return images, hpsv2_score(images, PARITY_PROMPTS)


def test_hps_on_float_images_equals_hpsv2_on_the_same_images_as_8bit_pil(hpsv2_score, hps_reward):
    """The default --hps_input uint8 path: decoded float images score as upstream scores them
    (diffusers' postprocess to 8-bit PIL, then HPS's preprocess_val), to 1e-6."""
    from fastvideo.rewards import tensor_to_pils

    gen = torch.Generator().manual_seed(3)
    floats = [torch.rand(1, 3, h, w, generator=gen) for h, w in PARITY_SIZES]
    theirs = hpsv2_score([tensor_to_pils(x)[0] for x in floats], PARITY_PROMPTS)
    assert hps_reward.input_precision == "uint8"
    ours = torch.cat([hps_reward(x, [p]) for x, p in zip(floats, PARITY_PROMPTS)])
    assert theirs.std() > 1e-3
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    # a batch of equal-size images takes the same path
    same = torch.cat(floats[4:5] * 3)
    torch.testing.assert_close(hps_reward(same, PARITY_PROMPTS[:3]),
                               hpsv2_score(tensor_to_pils(same), PARITY_PROMPTS[:3]), atol=1e-6, rtol=0)


def test_float_path_skips_the_8bit_rounding(hps_reward, tiny_rewards):
    """--hps_input float: no rounding; it differs from upstream's 8-bit path by more than the tolerance."""
    from fastvideo.rewards import build_reward

    float_hps = build_reward("hpsv2", hps_ckpt_dir=tiny_rewards.hps_ckpt_dir, model_name=tiny_rewards.hps_model_name,
                             input_precision="float")
    x = torch.rand(4, 3, 40, 48, generator=torch.Generator().manual_seed(4))
    a, b = hps_reward(x, PARITY_PROMPTS[:4]), float_hps(x, PARITY_PROMPTS[:4])
    assert (a - b).abs().max() > 1e-6
    torch.testing.assert_close(a, b, atol=1e-2, rtol=0)
    q = torch.round(x * 255) / 255
    torch.testing.assert_close(hps_reward(q, PARITY_PROMPTS[:4]), float_hps(q, PARITY_PROMPTS[:4]), atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def make_pils_module():
    import numpy as np
    from PIL import Image

    def make(sizes, seed=1):
        rng = np.random.default_rng(seed)
        return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]

    return make


def test_hps_matches_hpsv2_package(reference_scores, hps_reward):
    images, expected = reference_scores
    ours = hps_reward(images, PARITY_PROMPTS)
    assert expected.std() > 1e-3  # the comparison is not between constants
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_hps_tensor_input_matches_hpsv2_package(reference_scores, hps_reward):
    """[1, 3, H, W] tensors (from the same 8-bit pixels) take the same path as PIL images."""
    from fastvideo.rewards import pil_to_tensor

    images, expected = reference_scores
    ours = torch.cat(
        [hps_reward(pil_to_tensor(im)[None], [p]) for im, p in zip(images, PARITY_PROMPTS)]
    )
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_tokenizers_agree(img_score):
    """open_clip's SimpleTokenizer and hpsv2's tokenize give the same ids (77 tokens)."""
    import open_clip
    from hpsv2.src.open_clip import get_tokenizer

    ours = open_clip.get_tokenizer("ViT-H-14")(PARITY_PROMPTS)
    theirs = get_tokenizer("ViT-H-14")(PARITY_PROMPTS)
    assert ours.shape == (len(PARITY_PROMPTS), 77)
    assert torch.equal(ours, theirs)
