"""VideoAlign (rewards/videoalign.py) on a tiny VideoReward folder (tools/make_tiny_videoalign): its
scoring path equals a re-computation with transformers' stock Qwen2VLForConditionalGeneration and the
head on inputs built here from upstream's facts (tests/fixtures/videoalign_upstream.json: the prompt
template, the frame sampling and resizing outputs of KwaiVGI/VideoAlign at a pinned commit); the
heads' normalisation and --videoalign_weights; a LoRA checkpoint merged; the served path."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from fastvideo.rewards import videoalign_inputs as vi

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "videoalign_upstream.json").read_text())
PROMPTS = ["a cat on a sofa", "a dog running on the beach"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from fastvideo.tools.make_tiny_videoalign import make_tiny_videoalign

    return make_tiny_videoalign(tmp_path_factory.mktemp("videoalign"), seed=0)


@pytest.fixture(scope="module")
def reward(tiny_dir):
    from fastvideo.rewards.registry import build_reward

    return build_reward("videoalign", videoalign_dir=str(tiny_dir), batch_size=2)


def _clips(b=2, f=9, h=32, w=48, seed=0):
    return torch.rand(b, f, 3, h, w, generator=torch.Generator().manual_seed(seed))


def test_inputs_are_upstreams():
    assert vi.build_prompt("PROMPT") == FIXTURE["detailed_special_template"].replace("{text_prompt}", "PROMPT")
    assert vi.SPECIAL_TOKENS == tuple(FIXTURE["special_tokens"])
    for case in FIXTURE["frame_sampling"]:
        n = vi.smart_nframes(case["total_frames"], case["video_fps"], case.get("fps"), case.get("nframes"))
        assert (n, vi.frame_indices(case["total_frames"], n)) == (case["nframes_out"], case["indices"]), case
    for case in FIXTURE["smart_resize"]:
        got = vi.smart_resize(case["height"], case["width"], 28, case["min_pixels"], case["max_pixels"])
        assert list(got) == case["resized"], case
    with pytest.raises(ValueError, match="at least 2 frames"):
        vi.smart_nframes(1, 16.0)


def _reference_batch(base: Path, clips: torch.Tensor):
    """The processor's batch built from the fixture's facts: 8-bit frames at the upstream indices and size."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(base, padding_side="right")
    processor.tokenizer.add_special_tokens({"additional_special_tokens": FIXTURE["special_tokens"]})
    case = next(c for c in FIXTURE["frame_sampling"] if c["total_frames"] == clips.shape[1] and c.get("fps") == 2.0
                and c["video_fps"] == 16.0)
    size = next(s["resized"] for s in FIXTURE["smart_resize"] if (s["height"], s["width"]) == tuple(clips.shape[3:])
                and s["max_pixels"] == 240 * 320)
    videos = [TF.resize((c * 255).round().to(torch.uint8)[case["indices"]], size, InterpolationMode.BICUBIC,
                        antialias=True).float() for c in clips]
    template = FIXTURE["detailed_special_template"]
    texts = [FIXTURE["chat_format"].replace("{text}", template.replace("{text_prompt}", p)) for p in PROMPTS]
    batch = processor(text=texts, videos=videos, padding=True, return_tensors="pt", videos_kwargs={"do_rescale": True})
    return batch, processor.tokenizer.convert_tokens_to_ids(FIXTURE["special_tokens"])


def _stock_model(base: Path, state: dict):
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(base, torch_dtype=torch.float32)
    model.resize_token_embeddings(state["model.embed_tokens.weight"].shape[0])
    own = model.state_dict()
    renamed = {}
    for k, v in state.items():  # upstream's transformers 4.45 names -> the installed layout
        if k != "rm_head.weight":
            k = k if k in own else ("model." + k if k.startswith("visual.") else "model.language_model." + k[6:])
            renamed[k] = v
    model.load_state_dict(renamed, strict=True)
    return model.eval()


def test_scores_equal_stock_qwen2vl_and_the_head(tiny_dir, reward):
    base = tiny_dir / "Qwen2-VL-2B-Instruct"
    state = torch.load(tiny_dir / "checkpoint-1" / "model.pth", weights_only=True)
    model = _stock_model(base, state)
    clips = _clips()
    batch, special = _reference_batch(base, clips)
    ids = batch["input_ids"]
    positions = torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, ids.shape[0], -1)  # the fixture's "positions"
    norm = dict(model.named_modules())["model.norm" if hasattr(model.model, "norm") else "model.language_model.norm"]
    seen = []
    hook = norm.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=batch["attention_mask"], pixel_values_videos=batch["pixel_values_videos"],
              video_grid_thw=batch["video_grid_thw"], position_ids=positions)
    hook.remove()
    logits = seen[0] @ state["rm_head.weight"].T  # [B, L, 3]
    want = torch.stack([torch.stack([logits[b, (ids[b] == t).nonzero()[0, 0], k] for k, t in enumerate(special)])
                        for b in range(ids.shape[0])])
    got = reward.heads(clips, PROMPTS, normalise=False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (want[0] - want[1]).abs().min() > 1e-4  # each clip and prompt moves every head
    other = reward.heads(_clips(seed=1), PROMPTS, normalise=False)
    assert (other - got).abs().min() > 1e-5  # so do the frames


def test_heads_normalised_and_weighted_and_the_flags(tiny_dir, reward):
    from fastvideo.errors import ConfigError
    from fastvideo.rewards.flags import add_reward_flags, extras_from_args, extras_flags, reward_kwargs
    from fastvideo.rewards.registry import build_reward

    norm = json.loads((tiny_dir / "model_config.json").read_text())["inference_config"]
    clips = _clips()
    raw = reward.heads(clips, PROMPTS, normalise=False)
    heads = torch.stack([(raw[:, k] - norm[f"{h}_mean"]) / norm[f"{h}_std"] for k, h in enumerate(("VQ", "MQ", "TA"))],
                        dim=1)
    torch.testing.assert_close(reward.heads(clips, PROMPTS), heads)
    torch.testing.assert_close(reward(clips, PROMPTS), heads.sum(dim=1))  # upstream's Overall: 1, 1, 1
    p = argparse.ArgumentParser()
    add_reward_flags(p)
    extras = extras_from_args(p.parse_args(["--videoalign_dir", str(tiny_dir), "--videoalign_weights", "0.5,2,-1",
                                            "--videoalign_clip_fps", "24"]))
    assert extras.videoalign_weights == (0.5, 2.0, -1.0) and extras.videoalign_clip_fps == 24.0
    assert extras_flags(vars(extras))["videoalign_weights"] == "0.5,2,-1"
    weighted = build_reward("videoalign", **reward_kwargs(extras)["videoalign"])
    assert weighted.clip_fps == 24.0
    clips = _clips(f=13)  # 13 frames at 24 fps: 4 frames sampled (at 16 fps: 4 too, other indices)
    raw = weighted.heads(clips, PROMPTS)
    torch.testing.assert_close(weighted(clips, PROMPTS), raw @ torch.tensor([0.5, 2.0, -1.0]))
    from fastvideo.library_lines import is_current

    if not is_current():  # the trainer's video family (wan) is the current line's
        return
    # the trainer's flags reach the reward it builds (a Wan run's --rewards videoalign)
    from fastvideo.config import parse_config
    from fastvideo.training.builders import build_rewards

    common = ["--data_json_path", "x.json", "--pretrained_model_name_or_path", "m", "--output_dir", "o"]
    cfg = parse_config(["--model_family", "wan", "--rewards", "videoalign:2.0", "--videoalign_dir", str(tiny_dir),
                        "--videoalign_weights", "0.5,2,-1", "--videoalign_clip_fps", "24", *common], usage=False,
                       input_check=lambda c: None)
    torch.testing.assert_close(build_rewards(cfg, torch.device("cpu"))(clips, PROMPTS).total,
                               2.0 * (raw @ torch.tensor([0.5, 2.0, -1.0])))
    # without --videoalign_clip_fps the clips' rate is the family's (Wan2.2-TI2V-5B writes 24 fps), a flag wins
    cfg = parse_config(["--model_family", "wan", "--rewards", "videoalign:1", "--videoalign_dir", str(tiny_dir), *common],
                       usage=False, input_check=lambda c: None)
    ti2v, flagged = argparse.Namespace(video_fps=24), argparse.Namespace(video_fps=16)
    assert build_rewards(cfg, torch.device("cpu"), 0, ti2v).components[0][2].clip_fps == 24.0
    assert build_rewards(cfg, torch.device("cpu")).components[0][2].clip_fps == 16.0  # no family: the reward's default
    assert cfg.reward.extras.videoalign_clip_fps is None and extras_flags(vars(cfg.reward.extras))["videoalign_clip_fps"] is None
    cfg = parse_config(["--model_family", "wan", "--rewards", "videoalign:1", "--videoalign_dir", str(tiny_dir),
                        "--videoalign_clip_fps", "30", *common], usage=False, input_check=lambda c: None)
    assert build_rewards(cfg, torch.device("cpu"), 0, flagged).components[0][2].clip_fps == 30.0
    with pytest.raises(ConfigError, match="--rewards videoalign scores clips .* model family 'flux'"):
        parse_config(["--model_family", "flux", "--rewards", "videoalign:1", *common], usage=False,
                     input_check=lambda c: None)  # an image family: refused before any model loads


def test_a_lora_checkpoint_is_merged_and_a_missing_folder_says_where(tmp_path):
    from safetensors.torch import load_file

    from fastvideo.errors import MissingInputError
    from fastvideo.rewards.videoalign import VideoAlignReward
    from fastvideo.tools.make_tiny_videoalign import LORA, make_tiny_videoalign

    folder = make_tiny_videoalign(tmp_path / "lora", seed=1, lora=True)
    reward = VideoAlignReward(folder)
    adapters = load_file(folder / "checkpoint-1" / "adapter_model.safetensors")
    stem = "base_model.model.model.layers.1.self_attn.v_proj"
    base = load_file(folder / "Qwen2-VL-2B-Instruct" / "model.safetensors")
    name = next(k for k in base if k.endswith("layers.1.self_attn.v_proj.weight"))
    want = base[name] + LORA["lora_alpha"] / LORA["lora_r"] * adapters[f"{stem}.lora_B.weight"] @ adapters[
        f"{stem}.lora_A.weight"]
    got = dict(reward.vlm.named_parameters())[next(k for k in dict(reward.vlm.named_parameters())
                                                   if k.endswith("layers.1.self_attn.v_proj.weight"))]
    torch.testing.assert_close(got, want)
    rest = torch.load(folder / "checkpoint-1" / "non_lora_state_dict.pth", weights_only=True)
    assert torch.equal(reward.head.weight, adapters["base_model.model.rm_head.weight"])  # saved whole in the adapter
    assert torch.equal(reward.vlm.get_input_embeddings().weight, rest["base_model.model.model.embed_tokens.weight"])
    assert torch.isfinite(reward(_clips(1, 4, 28, 28), PROMPTS[:1])).all()
    with pytest.raises(MissingInputError, match="KwaiVGI/VideoReward --local-dir .*nowhere.*Qwen/Qwen2-VL-2B-Instruct"):
        VideoAlignReward(tmp_path / "nowhere")


def test_a_reward_server_serves_videoalign_to_a_remote_reward(tiny_dir, reward):
    from fastvideo.rewards.remote import RemoteReward
    from fastvideo.tools.reward_server import build_app, build_parser, build_rewards
    from server_utils import serve_in_thread

    args = build_parser().parse_args(["--rewards", "videoalign", "--videoalign_dir", str(tiny_dir), "--device", "cpu",
                                      "--videoalign_weights", "1,0.5,2", "--batch_size", "2"])
    rewards, info, _ = build_rewards(args)
    assert info["videoalign"]["takes_clips"] and rewards["videoalign"].clip_fps == 16.0
    clips = _clips(3)
    prompts = PROMPTS + ["a fox"]
    with serve_in_thread(build_app(rewards, info)) as (url, _):
        remote = RemoteReward(f"{url}/videoalign?encoding=f32", batch_size=8)
        assert remote.takes_clips
        got = remote(clips, prompts)
    torch.testing.assert_close(got, reward.heads(clips, prompts) @ torch.tensor([1.0, 0.5, 2.0]))
