"""Wan2.2-I2V-A14B's two experts through the trainer on 2 gloo ranks (the current library line, the tiny
make_tiny_wan --variant i2v_a14b: two 36-channel experts, boundary_ratio 0.9, no image encoder), the
bundled editing prompt file preprocessed for 5-frame 64x64 clips: GRPO trains 2 iterations with
--train_experts high,low and with --train_experts low. One run per choice asserts: the trained
experts' weights move and the frozen one's stay bit-unchanged, the reward is given each sample's own
first frame, and the export of checkpoint-2 loads in stock WanImageToVideoPipeline with transformer
and transformer_2 (the checkpoint's tensors, bit for bit) and animates a first frame otherwise than
the base (issue #48 item 2 at scale). The image-to-video launchers parse to Flow-Factory's configurations."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from current_line_helpers import WAN_I2V_LAUNCHERS, WEIGHTS, i2v_training_marks, launcher_argv
from edit_helpers import run_recorded
from helpers import ROOT, read_metrics
from test_wan_i2v_training import FRAMES, PROMPTS, SIZE, _animate
from test_wan_i2v_training import _argv as i2v_argv

pytestmark = i2v_training_marks()
EXPERTS = ("transformer", "transformer_2")


@pytest.fixture(scope="module")
def a14b_embeddings(tiny_wan_i2v_a14b_dir, tmp_path_factory):
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    cfg = PreprocessConfig(model_path=str(tiny_wan_i2v_a14b_dir), prompt_file=str(PROMPTS),
                           output_dir=str(tmp_path_factory.mktemp("wan_i2v_a14b_embeddings")),
                           max_sequence_length=512, batch_size=8, dataloader_num_workers=0,
                           model_family="wan_i2v", num_frames=FRAMES)
    return run_preprocess(cfg).json_path


def _base(folder) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v for name in EXPERTS
            for k, v in load_file(str(next((folder / name).glob("*.safetensors")))).items()}


@pytest.mark.slow
@pytest.mark.parametrize("experts", ["high,low", "low"])
def test_a14b_i2v_trains_the_chosen_experts_sees_each_first_frame_and_exports(
        experts, tiny_wan_i2v_a14b_dir, a14b_embeddings, tmp_path):
    from diffusers import WanImageToVideoPipeline

    from fastvideo.data.sources import load_pixels
    from fastvideo.training.export import export_checkpoint

    out, record = tmp_path / "grpo", tmp_path / "record"
    run_recorded(i2v_argv(tiny_wan_i2v_a14b_dir, a14b_embeddings, out, "--rewards", "record_sources:1.0",
                          "--guidance_scale", "3.5", "--guidance_scale_2", "3.5", "--train_experts", experts,
                          "--checkpointing_steps", "2"), record)
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2] and rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0
    trained = {"high,low": EXPERTS, "low": ("transformer_2",)}[experts]
    final, base = load_file(str(out / "checkpoint-2" / WEIGHTS)), _base(tiny_wan_i2v_a14b_dir)
    assert final.keys() == base.keys()  # both experts saved, under their folder names
    for expert in EXPERTS:
        moved = [not torch.equal(final[k], v) for k, v in base.items() if k.startswith(expert + ".")]
        if expert in trained:
            assert sum(moved) > len(moved) // 2, expert  # the trained expert's weights move
        else:
            assert not any(moved), expert  # the frozen one's are bit-unchanged
    calls = [torch.load(p, weights_only=True) for p in sorted(record.glob("rank*-*.pt"))]
    image_of = {r["prompt"]: ROOT / "assets/edit" / r["image"]
                for r in map(json.loads, PROMPTS.read_text().splitlines())}
    assert len(calls) == 4  # 2 ranks x 2 iterations
    for call in calls:  # every scored frame with its own clip's first frame
        assert call["sources"].shape == (len(call["prompts"]), 3, SIZE, SIZE)
        assert torch.equal(call["sources"], load_pixels([image_of[p] for p in call["prompts"]]))
    exported = export_checkpoint(out / "checkpoint-2", tmp_path / "export", base=tiny_wan_i2v_a14b_dir)
    pipe = WanImageToVideoPipeline.from_pretrained(exported)
    assert pipe.config.boundary_ratio == 0.9 and pipe.image_encoder is None
    for name in EXPERTS:
        state = getattr(pipe, name).state_dict()
        assert all(torch.equal(state[k], final[f"{name}.{k}"]) for k in state), name
    trained_clip, stock_clip = _animate(pipe), _animate(WanImageToVideoPipeline.from_pretrained(tiny_wan_i2v_a14b_dir))
    assert trained_clip.shape == stock_clip.shape and not torch.allclose(trained_clip, stock_clip, atol=1e-4)


@pytest.mark.parametrize("script", sorted(WAN_I2V_LAUNCHERS))
def test_i2v_launchers_parse_to_flow_factorys_configuration(script):
    """Flow-Factory's examples/grpo/full/wan21/i2v.yaml and wan22/i2v.yaml (5f6cda1), sources in
    scripts/finetune/wan_i2v_{14b,a14b}_grpo_args.sh: FSDP2, 5 frames, one Flow-SDE step at 0.9, 16 a group,
    48 prompts an iteration in 2 optimizer steps, PickScore; Wan2.1-I2V-14B at 240^2, 10 steps in 1..3,
    CFG 5.0, lr 1e-5, shift 3; Wan2.2-I2V-A14B's high-noise expert at 256^2, 8 steps, the SDE at step 1, CFG
    3.5, lr 1e-4, shift 5."""
    from fastvideo.config import build_parser, validate_args

    world, prompts, accumulation = WAN_I2V_LAUNCHERS[script]
    argv = launcher_argv(script)
    cfg = validate_args(build_parser(argv).parse_args(argv))
    r, g, m, wan = cfg.rollout, cfg.grpo, cfg.mix, cfg.plugins["wan"]
    a14b = "a14b" in script
    assert cfg.model.family == "wan_i2v" and cfg.fsdp_version == 2 and wan.num_frames == 5
    assert wan.train_experts == ("high" if a14b else "high,low")  # high,low: the default (a one-expert folder)
    assert (r.height, r.width, r.sampling_steps, r.guidance_scale, r.shift) == (
        (256, 256, 8, 3.5, 5.0) if a14b else (240, 240, 10, 5.0, 3.0))
    assert (r.eta, r.quantize_timestep, r.num_generations) == (0.9, False, 16)
    assert (m.mode, m.window_size, m.start_strategy, m.window_range) == ("fast", 1, "random", (1, 2 if a14b else 4))
    assert (g.clip_range, g.adv_clip_max, cfg.optim.weight_decay) == (1e-4, 5.0, 1e-4)
    assert cfg.optim.learning_rate == (1e-4 if a14b else 1e-5)
    assert [(s.name, s.weight) for s in cfg.reward.spec] == [("pickscore", 1.0)]
    assert cfg.prompts_per_rank == prompts and cfg.prompts_per_rank * world == 48
    assert cfg.update.gradient_accumulation_steps == accumulation
    assert cfg.derived(world)["optimizer_steps_per_iteration"] == 2
