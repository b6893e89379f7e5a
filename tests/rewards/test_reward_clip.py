"""PickScore and CLIP score (transformers CLIPModel) on tiny weights."""

import pytest
import torch

from fastvideo.rewards import RewardInputError, build_reward, tensor_to_pils


def _published_pickscore(model, processor, prompt, pil_images):
    """PickScore's published recipe (one prompt, many images), written out independently:
    logit_scale.exp() * normalised text embeds @ normalised image embeds.T."""
    with torch.no_grad():
        image_inputs = processor(images=pil_images, return_tensors="pt")
        text_inputs = processor(
            text=[prompt], padding=True, truncation=True, max_length=77, return_tensors="pt"
        )
        # CLIPModel's own forward (the same on both library lines): projected, normalised embeddings.
        out = model(**image_inputs, **text_inputs)
        image_embs, text_embs = out.image_embeds, out.text_embeds
        return model.logit_scale.exp() * (text_embs @ image_embs.T)[0]


@pytest.fixture(params=["pickscore", "clip"])
def reward(request, pickscore_reward, clip_reward):
    return {"pickscore": pickscore_reward, "clip": clip_reward}[request.param]


def test_deterministic(reward, make_images, prompts):
    x = make_images(4)
    a = reward(x, prompts)
    assert a.dtype == torch.float32 and a.shape == (4,)
    assert torch.equal(a, reward(x, prompts))
    assert a.std() > 1e-4


def test_batch_equals_single_calls(reward, make_images, prompts):
    x = make_images(4)
    batched = reward(x, prompts)  # batch_size=3; prompts padded to different lengths
    singles = torch.cat([reward(x[i : i + 1], prompts[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, singles, atol=1e-5, rtol=1e-5)


def test_each_image_scored_against_its_own_prompt(reward, make_images, prompts):
    x = make_images(2)
    ab = reward(x, prompts[:2])
    torch.testing.assert_close(reward(x.flip(0), prompts[1::-1]), ab.flip(0), atol=1e-5, rtol=0)
    assert (reward(x, prompts[1::-1]) - ab).abs().min() > 1e-5


def test_pickscore_matches_published_recipe(pickscore_reward, make_images, prompts):
    x = make_images(3)
    pils = tensor_to_pils(x)
    model, processor = pickscore_reward.model, pickscore_reward.processor
    # Per image, its own prompt: element i of the published score of prompt i.
    expected = torch.stack(
        [_published_pickscore(model, processor, p, pils)[i] for i, p in enumerate(prompts[:3])]
    )
    torch.testing.assert_close(pickscore_reward(x, prompts[:3]), expected, atol=1e-5, rtol=1e-5)


def test_pickscore_is_clip_score_times_logit_scale(pickscore_reward, clip_reward, make_images,
                                                   prompts):
    x = make_images(4)
    scale = pickscore_reward.model.logit_scale.exp().item()
    assert scale > 10  # 1 / 0.07 at init: a unit mix-up would show
    torch.testing.assert_close(
        pickscore_reward(x, prompts), clip_reward(x, prompts) * scale, atol=1e-4, rtol=1e-5
    )
    assert clip_reward(x, prompts).abs().max() <= 1.0


def test_separate_processor_dir(tiny_rewards, pickscore_reward, make_images, prompts):
    r = build_reward(
        "pickscore", pickscore_dir=tiny_rewards.pickscore_dir,
        processor_dir=tiny_rewards.pickscore_dir,
    )
    x = make_images(2)
    torch.testing.assert_close(r(x, prompts[:2]), pickscore_reward(x, prompts[:2]))


@pytest.mark.parametrize("name, arg", [("pickscore", "pickscore_dir"), ("clip", "clip_dir")])
def test_missing_folder(name, arg, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*config.json"):
        build_reward(name, **{arg: tmp_path / "nope"})


def test_missing_processor_files(tiny_rewards, tmp_path):
    (tmp_path / "proc").mkdir()
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json.*PickScore_v1"):
        build_reward("pickscore", pickscore_dir=tiny_rewards.pickscore_dir,
                     processor_dir=tmp_path / "proc")


def test_wrong_shapes(pickscore_reward, prompts):
    with pytest.raises(RewardInputError, match="channels-last"):
        pickscore_reward(torch.rand(2, 16, 16, 3), prompts[:2])
