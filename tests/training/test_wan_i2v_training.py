"""Wan image-to-video (--model_family wan_i2v) through the trainer on 2 gloo ranks, the current library
line: the bundled editing prompt file (8 instructions, 64x64 sources) preprocessed for 5-frame clips
(each first frame's VAE condition and CLIP features), GRPO trains 2 iterations on the tiny Wan2.1-I2V
(make_tiny_wan --variant i2v) with a reward that records the source images it is given (each sample's
own first frame, on every scored frame), and the export loads in the stock WanImageToVideoPipeline and
animates a first frame otherwise than the base. A prompt file without source images, a source image
that is missing, a run whose --h / --w are not the sources' size and one whose --num_frames is not
the preprocessing's are each one line, exit 2
(issue #48 item 2)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from current_line_helpers import WEIGHTS, i2v_training_marks
from edit_helpers import run_recorded
from helpers import ROOT, read_metrics
from one_line import one_line
from test_wan_training import GRPO
from test_wan_training import _argv as wan_argv

pytestmark = i2v_training_marks()
FRAMES, SIZE = 5, 64
PROMPTS = ROOT / "assets/edit/prompts_edit.jsonl"


@pytest.fixture(scope="module")
def i2v_embeddings(tiny_wan_i2v_dir, tmp_path_factory):
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    cfg = PreprocessConfig(model_path=str(tiny_wan_i2v_dir), prompt_file=str(PROMPTS),
                           output_dir=str(tmp_path_factory.mktemp("wan_i2v_embeddings")), max_sequence_length=512,
                           batch_size=8, dataloader_num_workers=0, model_family="wan_i2v", num_frames=FRAMES)
    return run_preprocess(cfg).json_path


def _argv(model, index, out, *extra):
    return wan_argv(model, index, out, *GRPO, "--model_family", "wan_i2v", "--h", str(SIZE), "--w", str(SIZE), *extra)


def _animate(pipe):
    from fastvideo.data.sources import open_rgb

    pipe.set_progress_bar_config(disable=True)
    latents = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    return pipe(image=open_rgb(ROOT / "assets/edit/images/00.png"), prompt="make the square green", height=SIZE,
                width=SIZE, num_frames=FRAMES, num_inference_steps=2, guidance_scale=5.0, latents=latents,
                output_type="latent").frames


@pytest.mark.slow
def test_wan_i2v_grpo_trains_sees_each_first_frame_and_exports(tiny_wan_i2v_dir, i2v_embeddings, tmp_path):
    from diffusers import WanImageToVideoPipeline

    from fastvideo.data.sources import load_pixels
    from fastvideo.training.export import export_checkpoint

    out = tmp_path / "grpo"
    run_recorded(_argv(tiny_wan_i2v_dir, i2v_embeddings, out, "--rewards", "record_sources:1.0",
                       "--checkpointing_steps", "2"), tmp_path / "record")
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0  # real updates on clips that differ
    assert rows[0]["forward_passes_rollout"] == 12  # 3 steps x 2 samples x 2 passes (guidance 5.0) per rank
    calls = [torch.load(p, weights_only=True) for p in sorted((tmp_path / "record").glob("rank*-*.pt"))]
    image_of = {r["prompt"]: ROOT / "assets/edit" / r["image"]
                for r in map(json.loads, PROMPTS.read_text().splitlines())}
    assert len(calls) == 4  # 2 ranks x 2 iterations
    for call in calls:  # every scored frame of a clip with its own first frame, exactly the prompt file's
        assert len(call["prompts"]) == 2 * FRAMES and call["sources"].shape == (2 * FRAMES, 3, SIZE, SIZE)
        assert torch.equal(call["sources"], load_pixels([image_of[p] for p in call["prompts"]]))
    assert len({p for call in calls for p in call["prompts"]}) > 1
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["family"] == "wan_i2v"
    final = load_file(str(out / "checkpoint-2" / WEIGHTS))
    base = load_file(str(next((tiny_wan_i2v_dir / "transformer").glob("*.safetensors"))))
    assert any(not torch.equal(final[k], v) for k, v in base.items() if k in final)
    exported = export_checkpoint(out / "checkpoint-2", tmp_path / "export", base=tiny_wan_i2v_dir)
    trained, stock = (_animate(WanImageToVideoPipeline.from_pretrained(p)) for p in (exported, tiny_wan_i2v_dir))
    assert trained.shape == stock.shape == (1, 16, 2, 8, 8) and not torch.allclose(trained, stock, atol=1e-4)


def test_missing_first_frames_and_a_clip_size_not_the_sources_areone_line(tiny_wan_i2v_dir, i2v_embeddings,
                                                                          tmp_path, capsys, monkeypatch):
    from fastvideo.data_preprocess.preprocess_embeddings import cli
    from fastvideo.train_grpo_flux import main

    def preprocess(prompt_file):
        return lambda: cli(["--model_path", str(tiny_wan_i2v_dir), "--prompt_path", str(prompt_file),
                            "--output_dir", str(tmp_path / "emb"), "--num_frames", str(FRAMES)])

    text = tmp_path / "prompts.txt"
    text.write_text("a red cube\n")
    line = one_line(capsys, preprocess(text))
    assert "'wan_i2v' makes each clip from a first frame" in line and ".jsonl" in line
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a red cube", "image": "gone.png"}) + "\n")
    line = one_line(capsys, preprocess(jsonl))
    assert "gone.png" in line
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    argv = _argv(tiny_wan_i2v_dir, i2v_embeddings, tmp_path / "out", "--h", "32", "--w", "32",
                 "--fsdp_sharding_strategy", "none", "--max_train_steps", "1")
    line = one_line(capsys, lambda: main(argv))
    assert "--h / --w the source images' size" in line
    argv = _argv(tiny_wan_i2v_dir, i2v_embeddings, tmp_path / "out9", "--num_frames", "9",
                 "--fsdp_sharding_strategy", "none", "--max_train_steps", "1")
    line = one_line(capsys, lambda: main(argv))
    assert "clips of 5 frames, this run makes 9" in line and "--num_frames 9" in line
