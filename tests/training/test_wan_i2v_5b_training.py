"""Wan2.2-TI2V-5B image-to-video (--model_family wan_i2v on make_tiny_wan --variant ti2v, the published
Wan2.2-TI2V-5B-Diffusers layout: WanPipeline's model_index.json with expand_timesteps, which the stock
WanImageToVideoPipeline loads) through the trainer on 2 gloo ranks, the current library line: the
bundled editing prompt file preprocessed for 5-frame 64x64 clips (each first frame's Wan2.2-VAE latents,
the given first latent frame), GRPO trains 2 iterations with a reward that records what it is given:
each sample's own source image, and clips whose first frame is the same for the two samples of a prompt
(given, not generated: no noise, no log-probability) while the generated frames differ; the export
loads in the stock WanImageToVideoPipeline and animates a first frame otherwise than the base
(issue #48 item 2)."""

from __future__ import annotations

import json

import pytest
import torch

from current_line_helpers import i2v_training_marks
from edit_helpers import run_recorded
from helpers import ROOT, read_metrics
from one_line import one_line
from test_wan_training import GRPO
from test_wan_training import _argv as wan_argv

pytestmark = i2v_training_marks()
FRAMES, SIZE = 5, 64
PROMPTS = ROOT / "assets/edit/prompts_edit.jsonl"


@pytest.fixture(scope="module")
def ti2v_embeddings(tiny_wan_ti2v_dir, tmp_path_factory):
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    return run_preprocess(PreprocessConfig(
        model_path=str(tiny_wan_ti2v_dir), prompt_file=str(PROMPTS),
        output_dir=str(tmp_path_factory.mktemp("wan_ti2v_i2v_embeddings")), max_sequence_length=512, batch_size=8,
        dataloader_num_workers=0, model_family="wan_i2v", num_frames=FRAMES)).json_path


def _argv(model, index, out, *extra):
    return wan_argv(model, index, out, *GRPO, "--model_family", "wan_i2v", "--h", str(SIZE), "--w", str(SIZE), *extra)


@pytest.mark.slow
def test_wan22_5b_i2v_grpo_keeps_the_given_first_frame_and_exports(tiny_wan_ti2v_dir, ti2v_embeddings, tmp_path):
    from diffusers import WanImageToVideoPipeline

    from fastvideo.data.sources import load_pixels, open_rgb
    from fastvideo.training.export import export_checkpoint

    out = tmp_path / "grpo"
    run_recorded(_argv(tiny_wan_ti2v_dir, ti2v_embeddings, out, "--rewards", "record_sources:1.0",
                       "--checkpointing_steps", "2"), tmp_path / "record")
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0  # real updates on clips that differ
    assert rows[0]["forward_passes_rollout"] == 12  # 3 steps x 2 samples x 2 passes (guidance 5.0) per rank
    calls = [torch.load(p, weights_only=True) for p in sorted((tmp_path / "record").glob("rank*-*.pt"))]
    image_of = {r["prompt"]: ROOT / "assets/edit" / r["image"]
                for r in map(json.loads, PROMPTS.read_text().splitlines())}
    assert len(calls) == 4  # 2 ranks x 2 iterations
    for call in calls:  # the two clips of one prompt (--init_same_noise): one first frame, their own motion
        assert torch.equal(call["sources"], load_pixels([image_of[p] for p in call["prompts"]]))
        clips = call["images"].view(2, FRAMES, 3, SIZE, SIZE)
        assert len(set(call["prompts"])) == 1
        torch.testing.assert_close(clips[0, 0], clips[1, 0], rtol=0, atol=1e-4)  # given: the same frame
        assert (clips[0, 1:] - clips[1, 1:]).abs().max() > 1e-3  # generated: SDE noise makes them differ
    assert json.loads((out / "config.json").read_text())["model"]["family"] == "wan_i2v"
    exported = export_checkpoint(out / "checkpoint-2", tmp_path / "export", base=tiny_wan_ti2v_dir)

    def animate(path):
        pipe = WanImageToVideoPipeline.from_pretrained(path)
        pipe.set_progress_bar_config(disable=True)
        latents = torch.randn(1, 48, 2, 4, 4, generator=torch.Generator().manual_seed(0))
        return pipe(image=open_rgb(ROOT / "assets/edit/images/00.png"), prompt="make the square green",
                    height=SIZE, width=SIZE, num_frames=FRAMES, num_inference_steps=2, guidance_scale=5.0,
                    latents=latents, output_type="latent").frames

    trained, stock = animate(exported), animate(tiny_wan_ti2v_dir)
    assert trained.shape == stock.shape == (1, 48, 2, 4, 4)
    torch.testing.assert_close(trained[:, :, 0], stock[:, :, 0], rtol=0, atol=0)  # the given frame: the same
    assert not torch.allclose(trained[:, :, 1:], stock[:, :, 1:], atol=1e-4)


def test_a_clip_size_not_the_sources_is_one_line_before_any_model_loads(tiny_wan_ti2v_dir, ti2v_embeddings, tmp_path,
                                                                         capsys, monkeypatch):
    """--h / --w other than the stored first frames' size: one line, exit 2, from the start-up's data check
    (the models' loader is never called), naming the sources' size."""
    from fastvideo.train_grpo_flux import main
    from fastvideo.training import builders

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)

    def no_models(*args, **kwargs):
        raise AssertionError("the models were loaded before the size check")

    monkeypatch.setattr(builders, "build_models", no_models)
    argv = _argv(tiny_wan_ti2v_dir, ti2v_embeddings, tmp_path / "out", "--h", "32", "--w", "96",
                 "--fsdp_sharding_strategy", "none", "--max_train_steps", "1")
    line = one_line(capsys, lambda: main(argv))
    assert "--h / --w the source images' size (--h 64 --w 64)" in line and "96x32 clips" in line
