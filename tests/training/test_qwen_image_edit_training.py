"""Qwen-Image-Edit through the trainer on 2 gloo ranks: the 8-GPU launcher's GRPO (Flow-Factory's
qwen_image_edit_plus values, tiny overrides) trains 2 iterations on the tiny editing prompt file with
its source images; the reward function receives each sample's source image; a resumed run equals the
straight one bit for bit; the export loads in the stock QwenImageEditPlusPipeline and changes its
output; DiffusionNFT trains too. The current library line (the stock pipeline and the launchers' line).
The preprocessing here encodes the sources at a 64^2 VAE area (--source_vae_size 64; the pipeline's
1024^2 would make 4096 source tokens per sample on the CPU)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from current_line_helpers import WEIGHTS, line_reason
from helpers import ROOT, read_metrics
from edit_helpers import run_recorded
from test_kontext_training import forked_only, launcher_words

pytestmark = pytest.mark.skipif(line_reason("Qwen-Image-Edit training") is not None,
                                reason=line_reason("Qwen-Image-Edit training") or "")
LAUNCHER = "scripts/finetune/finetune_qwen_image_edit_grpo_8gpus.sh"
SEQ = 320  # the instruction with its 384^2 condition image's tokens


@pytest.fixture(scope="module")
def edit_dir(tmp_path_factory):
    from fastvideo.tools.make_tiny_qwen_image_edit import make_tiny_qwen_image_edit

    return make_tiny_qwen_image_edit(tmp_path_factory.mktemp("tiny_qwen_image_edit"), seed=0)


@pytest.fixture(scope="module")
def edit_embeddings(edit_dir, tmp_path_factory):
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    cfg = PreprocessConfig(model_path=str(edit_dir), prompt_file=str(ROOT / "assets/edit/prompts_edit.jsonl"),
                           output_dir=str(tmp_path_factory.mktemp("qwen_edit_embeddings")), max_sequence_length=SEQ,
                           batch_size=8, dataloader_num_workers=0, model_family="qwen_image_edit",
                           source_vae_size=(64, 64))
    return run_preprocess(cfg).json_path


def _argv(model, index, out, clip_dir, **more) -> list[str]:
    words = launcher_words(LAUNCHER, LEAN="0")  # the tiny run as before (lean options need bf16 autocast)
    tiny = dict(pretrained_model_name_or_path=model, data_json_path=index, output_dir=out, h=32, w=32,
                sampling_steps=4, num_generations=2, train_batch_size=1, rollout_batch_size=2,
                train_micro_batch_size=2, gradient_accumulation_steps=1, rewards="record_sources:1.0,clip_edit:0.5",
                clip_dir=clip_dir, max_train_steps=2, checkpointing_steps=1, dataloader_num_workers=0,
                save_images_every=0, learning_rate=1e-3, mixed_precision="no", **more)
    argv = words[words.index("fastvideo/train_grpo_flux.py") + 1:]
    return argv + [w for k, v in tiny.items() for w in (f"--{k}", str(v))]


@pytest.fixture(scope="module")
def grpo_runs(edit_dir, edit_embeddings, tiny_rewards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qwen_edit_grpo")
    straight, resumed = tmp / "straight", tmp / "resumed"
    run_recorded(_argv(edit_dir, edit_embeddings, straight, tiny_rewards.pickscore_dir), tmp / "record")
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-2"))
    run_recorded(_argv(edit_dir, edit_embeddings, resumed, tiny_rewards.pickscore_dir)
         + ["--resume_from_checkpoint", "latest"], tmp / "record_resumed")
    return straight, resumed, tmp / "record"


def test_launchers_parse_to_flow_factorys_edit_configuration():
    from fastvideo.config import build_parser, validate_args

    for script, world, per_rank, accumulation in ((LAUNCHER, 8, 6, 24),
                                                  ("scripts/finetune/finetune_qwen_image_edit_grpo_a3_16die.sh", 16,
                                                   3, 12)):
        words = launcher_words(script)
        assert f"--nproc_per_node={world}" in words
        cfg = validate_args(build_parser().parse_args(words[words.index("fastvideo/train_grpo_flux.py") + 1:]))
        assert cfg.model.family == "qwen_image_edit" and cfg.rollout.guidance_scale == 4.0 and cfg.rollout.eta == 1.0
        assert (cfg.rollout.height, cfg.rollout.width, cfg.rollout.sampling_steps) == (384, 384, 10)
        assert cfg.prompts_per_rank == per_rank and cfg.update.gradient_accumulation_steps == accumulation


def test_preprocessing_launcher_passes_flow_factorys_source_vae_size():
    """The preprocessing launcher's command: --source_vae_size 384 (FF's condition_image_size [384, 384]),
    which sizes the family's VAE area; SOURCE_VAE_SIZE unset, the stock pipeline's 1024 is not used."""
    from fastvideo.data_preprocess.preprocess_embeddings import parse_args

    words = launcher_words("scripts/preprocess/preprocess_qwen_image_edit_rl_embeddings.sh")
    cfg = parse_args(words[words.index("fastvideo/data_preprocess/preprocess_embeddings.py") + 1:])
    assert cfg.model_family == "qwen_image_edit" and cfg.source_vae_size == (384, 384)
    assert cfg.family().vae_area == 384 * 384 and cfg.max_sequence_length == 512


@forked_only
@pytest.mark.slow
def test_qwen_edit_grpo_trains_sees_sources_resumes_exactly_and_exports(edit_dir, grpo_runs, tmp_path):
    from diffusers import QwenImageEditPlusPipeline

    from fastvideo.data.sources import load_pixels
    from fastvideo.training.export import export_checkpoint

    straight, resumed, record = grpo_runs
    rows, again = read_metrics(straight), read_metrics(resumed)
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [1, 2]
    for key in ("reward_mean", "loss", "grad_norm"):
        assert rows[1][key] == again[1][key], key
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0
    calls = [torch.load(p, weights_only=True) for p in sorted(record.glob("rank*-*.pt"))]
    assert {p.name.split("-")[0] for p in record.glob("*.pt")} == {"rank0", "rank1"} and len(calls) == 4
    plist = [json.loads(line) for line in (ROOT / "assets/edit/prompts_edit.jsonl").read_text().splitlines()]
    image_of = {r["prompt"]: ROOT / "assets/edit" / r["image"] for r in plist}
    for call in calls:
        assert torch.equal(call["sources"], load_pixels([image_of[p] for p in call["prompts"]]))
    final = load_file(str(straight / "checkpoint-2" / WEIGHTS))
    again_final = load_file(str(resumed / "checkpoint-2" / WEIGHTS))
    assert all(torch.equal(final[k], again_final[k]) for k in final)
    assert json.loads((straight / "config.json").read_text())["model"]["family"] == "qwen_image_edit"
    out = export_checkpoint(straight / "checkpoint-2", tmp_path / "export", base=edit_dir)
    trained, stock = (_edit(QwenImageEditPlusPipeline.from_pretrained(p)) for p in (out, edit_dir))
    assert trained.shape == stock.shape and not torch.allclose(trained, stock, atol=1e-4)


def _edit(pipe):
    from fastvideo.data.sources import open_rgb

    pipe.set_progress_bar_config(disable=True)
    latents = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0))
    return pipe(image=open_rgb(ROOT / "assets/edit/images/00.png"), prompt="make the square green",
                negative_prompt=" ", height=32, width=32, num_inference_steps=2, latents=latents,
                output_type="latent").images


@forked_only
@pytest.mark.slow
def test_qwen_edit_nft_trains_on_two_ranks(edit_dir, edit_embeddings, tiny_rewards, tmp_path):
    argv = _argv(edit_dir, edit_embeddings, tmp_path / "nft", tiny_rewards.pickscore_dir, algorithm="nft",
                 timestep_fraction=0.5)
    for flag in ("--sde_steps", "--sde_start", "--sde_window_range", "--flow_grpo_sampling"):
        i = argv.index(flag)
        del argv[i:i + (1 if flag == "--flow_grpo_sampling" else 2)]
    run_recorded(argv, tmp_path / "record")
    rows = read_metrics(tmp_path / "nft")
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    base = load_file(str(next((edit_dir / "transformer").glob("*.safetensors"))))
    final = load_file(str(tmp_path / "nft" / "checkpoint-2" / WEIGHTS))
    assert any(not torch.equal(final[k], base[k]) for k in base)
