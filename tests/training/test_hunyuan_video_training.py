"""HunyuanVideo through the trainer on 2 gloo ranks, on both library lines, 5-frame clips of the tiny
folder after preprocessing (Llama under the pipeline's template with its mask, CLIP pooled): GRPO (the
embedded guidance 6.0, one pass per velocity; DanceGRPO's floor(1000 sigma) timesteps and SDE,
compressibility averaged over every frame) trains 2 iterations, resumes bit-exactly and exports a
folder HunyuanVideoPipeline loads and whose output differs from the base's; DiffusionNFT and LoRA train
too. One module of runs, each asserted several ways (issue #48 item 3)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from helpers import read_metrics, torchrun

FRAMES, SEQ, WEIGHTS = 5, 40, "diffusion_pytorch_model.safetensors"


def _argv(model, index, out, *extra):
    return ["--seed", "42", "--model_family", "hunyuan_video", "--num_frames", str(FRAMES),
            "--pretrained_model_name_or_path", str(model), "--data_json_path", str(index), "--output_dir", str(out),
            "--rewards", "compressibility:1.0", "--h", "32", "--w", "32", "--sampling_steps", "3", "--eta", "0.3",
            "--shift", "5", "--num_generations", "2", "--train_batch_size", "1", "--rollout_batch_size", "2",
            "--train_micro_batch_size", "2", "--use_group", "--mixed_precision", "no", "--max_train_steps", "2",
            "--checkpointing_steps", "1", "--dataloader_num_workers", "0", "--learning_rate", "1e-2",
            "--guidance_scale", "6.0", "--save_images_every", "0", *extra]


GRPO = ("--timestep_fraction", "1.0", "--init_same_noise")


def _run(argv):
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tiny_hunyuan_video_dir, hunyuan_video_embeddings, tmp_path_factory):
    """GRPO 2 iterations, then resumed from checkpoint-1 (as after a crash in iteration 2); NFT; GRPO
    with LoRA."""
    tmp = tmp_path_factory.mktemp("hunyuan_video_runs")
    model, index = tiny_hunyuan_video_dir, hunyuan_video_embeddings
    out = {name: tmp / name for name in ("grpo", "resumed", "nft", "lora")}
    _run(_argv(model, index, out["grpo"], *GRPO))
    shutil.copytree(out["grpo"], out["resumed"], ignore=shutil.ignore_patterns("checkpoint-2"))
    _run(_argv(model, index, out["resumed"], *GRPO, "--resume_from_checkpoint", "latest"))
    _run(_argv(model, index, out["nft"], "--algorithm", "nft", "--timestep_fraction", "0.5", "--no_quantize_timestep"))
    _run(_argv(model, index, out["lora"], *GRPO, "--use_lora", "--lora_rank", "4", "--lora_alpha", "8"))
    return out


def _latents(pipe):
    pipe.set_progress_bar_config(disable=True)
    latents = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))  # 5 frames at 32 px
    return pipe(prompt="a red fox", guidance_scale=6.0, height=32, width=32, num_frames=FRAMES,
                num_inference_steps=2, latents=latents, max_sequence_length=SEQ, output_type="latent").frames


def _pipe(folder):
    from diffusers import HunyuanVideoPipeline

    from fastvideo.models.hunyuan_video.components import load_llama_tokenizer

    return HunyuanVideoPipeline.from_pretrained(folder, tokenizer=load_llama_tokenizer(folder))


@pytest.mark.slow
def test_hunyuan_video_grpo_trains_resumes_exactly_and_exports_a_pipeline_folder(tiny_hunyuan_video_dir, runs,
                                                                               tmp_path):
    from fastvideo.training.export import export_checkpoint

    rows, again = read_metrics(runs["grpo"]), read_metrics(runs["resumed"])
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [1, 2]
    for key in ("reward_mean", "loss", "grad_norm"):
        assert rows[1][key] == again[1][key], key
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0  # real updates on clips that differ
    assert rows[0]["forward_passes_rollout"] == 6  # 3 steps x 2 samples x 1 pass (embedded guidance) per rank
    final = load_file(str(runs["grpo"] / "checkpoint-2" / WEIGHTS))
    again_final = load_file(str(runs["resumed"] / "checkpoint-2" / WEIGHTS))
    assert final.keys() == again_final.keys() and all(torch.equal(final[k], again_final[k]) for k in final)
    base = load_file(str(next((tiny_hunyuan_video_dir / "transformer").glob("*.safetensors"))))
    assert set(final) == set(base) and any(not torch.equal(final[k], base[k]) for k in base)
    config = json.loads((runs["grpo"] / "config.json").read_text())
    assert config["model"]["family"] == "hunyuan_video" and config["plugins"]["hunyuan_video"]["num_frames"] == FRAMES

    out = export_checkpoint(runs["grpo"] / "checkpoint-2", tmp_path / "export", base=tiny_hunyuan_video_dir)
    exported = json.loads((out / "transformer" / "config.json").read_text())
    assert exported["_class_name"] == "HunyuanVideoTransformer3DModel"
    trained, stock = _latents(_pipe(out)), _latents(_pipe(tiny_hunyuan_video_dir))
    assert trained.shape == stock.shape == (1, 16, 2, 4, 4) and not torch.allclose(trained, stock, atol=1e-4)


@pytest.mark.slow
def test_hunyuan_video_nft_and_lora_train_on_two_ranks(tiny_hunyuan_video_dir, runs):
    rows = read_metrics(runs["nft"])
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    base = load_file(str(next((tiny_hunyuan_video_dir / "transformer").glob("*.safetensors"))))
    final = load_file(str(runs["nft"] / "checkpoint-2" / WEIGHTS))
    assert any(not torch.equal(final[k], base[k]) for k in base)
    lora = read_metrics(runs["lora"])
    assert [r["iteration"] for r in lora] == [1, 2] and lora[0]["grad_norm"] > 0
    adapters = load_file(str(runs["lora"] / "checkpoint-2" / "pytorch_lora_weights.safetensors"))
    assert adapters and any("transformer_blocks.0.attn.to_q" in k for k in adapters)
    assert any(float(v.abs().max()) > 0 for k, v in adapters.items() if "lora_B" in k)  # B moved from zero


LAUNCHERS = {"scripts/finetune/finetune_hunyuan_video_grpo_8gpus.sh": (8, 4, 16),
             "scripts/finetune/finetune_hunyuan_video_grpo_a3_16die.sh": (16, 2, 8)}


@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_hunyuan_video_launchers_parse_to_dancegrpos_configuration(script):
    """DanceGRPO's finetune_hunyuan_grpo.sh (15cc71d): 53 frames at 480x480, 16 steps, eta 0.25, shift 5, 24
    clips a prompt of which --bestofn 8 train, 32 prompts and 2 optimizer steps an iteration; sources in
    hunyuan_video_grpo_args.sh."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    from fastvideo.config import build_parser, validate_args

    world, prompts, accumulation = LAUNCHERS[script]
    root = Path(__file__).resolve().parents[2]
    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root")}
    out = subprocess.run(["bash", str(root / script)], capture_output=True, text=True, env=env, cwd=root, timeout=120)
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    assert f"--nproc_per_node={world}" in words
    argv = words[words.index("fastvideo/train_grpo_flux.py") + 1:]
    cfg = validate_args(build_parser(argv).parse_args(argv))
    r, g, m, u = cfg.rollout, cfg.grpo, cfg.mix, cfg.update
    assert cfg.model.family == "hunyuan_video" and cfg.plugins["hunyuan_video"].num_frames == 53
    assert (r.height, r.width, r.sampling_steps, r.eta, r.shift) == (480, 480, 16, 0.25, 5.0)
    assert (r.guidance_scale, r.quantize_timestep, r.num_generations, r.init_same_noise) == (6.0, True, 24, True)
    assert r.bestofn == 8 and cfg.derived(world)["micro_batches_per_rank"] == prompts * 8  # DG: 8 of 24 train
    assert m.sde_kind == "dance" and m.mode == "full" and g.timestep_fraction == 0.6 and not cfg.lora.enabled
    assert (g.clip_range, g.adv_clip_max, cfg.optim.max_grad_norm, cfg.optim.weight_decay) == (1e-4, 5.0, 1.0, 1e-4)
    assert cfg.optim.learning_rate == 1e-5 and cfg.prompts_per_rank == prompts and cfg.prompts_per_rank * world == 32
    assert u.gradient_accumulation_steps == accumulation and cfg.derived(world)["optimizer_steps_per_iteration"] == 2
