"""Our ImageReward scores == the image-reward package's own ImageReward.score, same (tiny) weights.

The reference side is image-reward 1.5 itself: ImageReward/ImageReward.py (its preprocessing,
tokenisation, BLIP forward, MLP and normalisation) with its BLIP code (models/BLIP: the timm-style
ViT, med.py's BERT with cross-attention), loading our tiny ImageReward.pt with strict=True. Only
sizes differ, patched where the package hard-codes them: create_vit builds the package's own
VisionTransformer at width 64 / depth 2 instead of ViT-L, MLP(768) is built for the tiny text
width, and bert-base-uncased's tokenizer is the tiny vocabulary (the package fetches it from the
hub). The package's __init__ (which also imports its CLIP/aesthetic scorers and a training
script needing `datasets`) is bypassed: only ImageReward.py and models/BLIP are imported.

Install the reference with scripts/install_hpsv2_parity.sh (which runs
scripts/install_reward_parity.sh). Without it the test skips, unless FLUX_GRPO_REQUIRE_PARITY is
set (CI), where it must run.
"""

import importlib
import importlib.util
import os
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from reference_shims import apply_transformers5_shims

pytestmark = pytest.mark.network

LONG_PROMPT = " ".join(["a very long prompt about a castle"] * 10)  # > 35 tokens: truncation
PROMPTS = ["a red cube on the table", "Cafe at NIGHT, with dog!", LONG_PROMPT, "x", "blue sky over mountains"]
SIZES = [(240, 260), (224, 224), (120, 300), (300, 190), (64, 64)]  # h, w


def _import_reference():
    """ImageReward.ImageReward and its BLIP modules without the package __init__, or None."""
    spec = importlib.util.find_spec("ImageReward")
    if spec is None or importlib.util.find_spec("fairscale") is None:
        if os.environ.get("FLUX_GRPO_REQUIRE_PARITY"):
            raise AssertionError("FLUX_GRPO_REQUIRE_PARITY is set but image-reward / fairscale are not "
                                 "installed; run scripts/install_hpsv2_parity.sh")
        return None
    apply_transformers5_shims()  # current line: helpers transformers 5 moved (reference_shims.py)
    root = Path(spec.origin).parent
    for name, folder in (("ImageReward", root), ("ImageReward.models", root / "models")):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [str(folder)]
            sys.modules[name] = stub
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm's deprecated import paths
        ir = importlib.import_module("ImageReward.ImageReward")
        blip = importlib.import_module("ImageReward.models.BLIP.blip")
        pretrain = importlib.import_module("ImageReward.models.BLIP.blip_pretrain")
        vit = importlib.import_module("ImageReward.models.BLIP.vit")
    return ir, blip, pretrain, vit


@pytest.fixture(scope="module")
def reference(tiny_rewards):
    from fastvideo.library_lines import RECIPE, library_line

    if library_line() != RECIPE:
        pytest.skip("recipe line only: image-reward 1.5's BLIP calls transformers 4.x ModuleUtilsMixin methods "
                    "that transformers 5 removed (invert_attention_mask, get_extended_attention_mask); the recipe "
                    "line's suite runs this parity (LINE=recipe bash scripts/run_tests.sh)")
    modules = _import_reference()
    if modules is None:
        pytest.skip("image-reward not installed (scripts/install_hpsv2_parity.sh)")
    ir, blip, pretrain, vit = modules
    from fastvideo.tools.make_tiny_image_reward import TINY_MED, TINY_VIT

    folder = tiny_rewards.image_reward_dir
    real_tokenizer, real_create_vit, real_mlp = blip.BertTokenizer, pretrain.create_vit, ir.MLP

    class LocalTokenizer:
        @staticmethod
        def from_pretrained(name, **kwargs):
            assert name == "bert-base-uncased"
            return real_tokenizer.from_pretrained(str(folder))

    def tiny_vit(kind, image_size, *args):
        assert kind == "large" and image_size == 224  # what ImageReward asks for
        v = TINY_VIT
        return vit.VisionTransformer(img_size=image_size, patch_size=v["patch"], embed_dim=v["width"],
                                     depth=v["depth"], num_heads=v["width"] // 64,
                                     mlp_ratio=v["mlp"] / v["width"]), v["width"]

    blip.BertTokenizer, pretrain.create_vit = LocalTokenizer, tiny_vit
    ir.MLP = lambda input_size: real_mlp(TINY_MED["hidden_size"])
    try:
        model = ir.ImageReward(med_config=str(folder / "med_config.json"), device="cpu")
    finally:
        blip.BertTokenizer, pretrain.create_vit, ir.MLP = real_tokenizer, real_create_vit, real_mlp
    state = torch.load(folder / "ImageReward.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)  # the tiny file has exactly the package's keys
    return model.eval()


def test_imagereward_matches_the_package(reference, tiny_rewards, make_pils):
    from fastvideo.rewards import build_reward

    ours = build_reward("imagereward", image_reward_dir=tiny_rewards.image_reward_dir, batch_size=2)
    pils = make_pils(SIZES, seed=4)
    with torch.no_grad():
        expected = torch.tensor([reference.score(p, im) for p, im in zip(PROMPTS, pils)], dtype=torch.float32)
    got = ours(pils, PROMPTS)
    assert expected.std() > 0.1  # images and prompts really score differently
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_prompt_matters_and_is_truncated_at_35_tokens(tiny_rewards, make_pils):
    from fastvideo.rewards import build_reward

    ours = build_reward("imagereward", image_reward_dir=tiny_rewards.image_reward_dir)
    pil = make_pils([(64, 64)], seed=1)
    scores = ours(pil * 3, ["a red cube", "a blue dog", LONG_PROMPT + " on the beach"])
    assert scores[0] != scores[1]
    torch.testing.assert_close(scores[2], ours(pil, [LONG_PROMPT])[0])  # words past 35 tokens ignored
