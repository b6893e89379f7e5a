"""The editing reward interface: sources reach only the rewards that declare uses_sources (the others
are called as before), and clip_edit equals its formula on the CLIP features of the clip reward's
own model (nothing new to download)."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, random_images
from fastvideo.rewards import build_reward
from fastvideo.rewards.base import RewardInputError
from fastvideo.rewards.combine import MultiReward


@pytest.fixture(scope="module")
def edit_reward(tiny_rewards):
    return build_reward("clip_edit", clip_dir=tiny_rewards.pickscore_dir, batch_size=3)


def _features(reward, images, prompts):
    from fastvideo.library_lines import projected_features
    from fastvideo.rewards.base import as_pils

    p = reward.processor
    text = p(text=prompts, padding=True, truncation=True, max_length=reward.max_length, return_tensors="pt")
    with torch.no_grad():
        img = projected_features(reward.model.get_image_features(
            pixel_values=p(images=as_pils(images), return_tensors="pt")["pixel_values"]))
        txt = projected_features(reward.model.get_text_features(input_ids=text["input_ids"],
                                                                attention_mask=text["attention_mask"]))
    return torch.nn.functional.normalize(img.float(), dim=-1), torch.nn.functional.normalize(txt.float(), dim=-1)


def test_clip_edit_is_source_similarity_blended_with_instruction_score(edit_reward):
    images, sources = random_images(4, seed=0), random_images(4, h=32, w=32, seed=1)
    img, txt = _features(edit_reward, images, PROMPTS)
    src, _ = _features(edit_reward, sources, PROMPTS)
    expected = 0.5 * (img * src).sum(-1) + 0.5 * (img * txt).sum(-1)
    got = edit_reward(images, PROMPTS, sources=sources)  # chunks of 3: sources sliced with their images
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    same = edit_reward(images, PROMPTS, sources=images)  # an unchanged image keeps everything
    assert torch.all(same > got)
    with pytest.raises(RewardInputError, match="clip_edit reward compares each image with its source") as info:
        edit_reward(images, PROMPTS)
    assert "\n" not in str(info.value)


def test_multireward_gives_sources_only_to_rewards_that_take_them(edit_reward, clip_reward):
    seen = []

    class Plain:  # an old-style reward: (images, prompts) and nothing else
        name = "plain"

        def __call__(self, images, prompts):
            seen.append(len(prompts))
            return torch.zeros(len(prompts))

    multi = MultiReward([("plain", 1.0, Plain()), ("clip", 1.0, clip_reward), ("clip_edit", 1.0, edit_reward)])
    images, sources = random_images(4, seed=0), random_images(4, seed=1)
    raw = multi.score_raw(images, PROMPTS, sources)
    assert seen == [4] and torch.equal(raw["clip"], clip_reward(images, PROMPTS))
    assert torch.equal(raw["clip_edit"], edit_reward(images, PROMPTS, sources=sources))
    assert torch.equal(MultiReward([("plain", 1.0, Plain())])(images, PROMPTS).total, torch.zeros(4))


def test_keep_weighs_the_source_term(tiny_rewards, edit_reward):
    """keep=0.8: 0.8 cos(image, source) + 0.2 cos(image, instruction) (at the default 0.5 a swap of the two
    weights would not show); outside [0, 1] it is refused."""
    keep = build_reward("clip_edit", clip_dir=tiny_rewards.pickscore_dir, batch_size=4, keep=0.8)
    images, sources = random_images(4, seed=2), random_images(4, seed=3)
    img, txt = _features(edit_reward, images, PROMPTS)
    src, _ = _features(edit_reward, sources, PROMPTS)
    expected = 0.8 * (img * src).sum(-1) + 0.2 * (img * txt).sum(-1)
    torch.testing.assert_close(keep(images, PROMPTS, sources=sources), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"keep must be in \[0, 1\]; got 1.5"):
        build_reward("clip_edit", clip_dir=tiny_rewards.pickscore_dir, keep=1.5)
