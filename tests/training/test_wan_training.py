"""Wan through the trainer on 2 gloo ranks, the current library line, 5-frame clips of the tiny
Wan2.1-T2V after preprocessing (umT5, the negative prompt encoded once): GRPO (WanPipeline's CFG 5.0
with its negative "", Flow-GRPO's SDE over the video latents, compressibility averaged over every
frame) trains 2 iterations, writes its sample clips as MP4s of the trained frames, resumes bit-exactly
and exports a folder WanPipeline loads and whose output differs from the base's; DiffusionNFT and LoRA
train too. One module of runs, each asserted
several ways (issue #47 item 5)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from current_line_helpers import WAN_LAUNCHERS, WEIGHTS, launcher_argv, line_reason
from helpers import read_metrics, torchrun

pytestmark = pytest.mark.skipif(line_reason("Wan training") is not None, reason=line_reason("Wan training") or "")
FRAMES, SEQ = 5, 32


def _argv(model, index, out, *extra):
    return ["--seed", "42", "--model_family", "wan", "--num_frames", str(FRAMES),
            "--pretrained_model_name_or_path", str(model), "--data_json_path", str(index), "--output_dir", str(out),
            "--rewards", "compressibility:1.0", "--h", "32", "--w", "32", "--sampling_steps", "3", "--eta", "0.7",
            "--shift", "3", "--num_generations", "2", "--train_batch_size", "1", "--rollout_batch_size", "2",
            "--train_micro_batch_size", "2", "--use_group", "--mixed_precision", "no", "--max_train_steps", "2",
            "--checkpointing_steps", "1", "--dataloader_num_workers", "0", "--learning_rate", "1e-2",
            "--guidance_scale", "5.0", "--no_quantize_timestep", "--save_images_every", "0", *extra]


GRPO = ("--flow_grpo_sampling", "--timestep_fraction", "1.0", "--init_same_noise")


def _run(argv):
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tiny_wan_dir, wan_embeddings, tmp_path_factory):
    """GRPO 2 iterations, then resumed from checkpoint-1 (as after a crash in iteration 2); NFT; GRPO
    with LoRA."""
    tmp = tmp_path_factory.mktemp("wan_runs")
    out = {name: tmp / name for name in ("grpo", "resumed", "nft", "lora")}
    _run(_argv(tiny_wan_dir, wan_embeddings, out["grpo"], *GRPO, "--save_images_every", "1"))  # its sample clips
    shutil.copytree(out["grpo"], out["resumed"], ignore=shutil.ignore_patterns("checkpoint-2"))
    _run(_argv(tiny_wan_dir, wan_embeddings, out["resumed"], *GRPO, "--resume_from_checkpoint", "latest"))
    _run(_argv(tiny_wan_dir, wan_embeddings, out["nft"], "--algorithm", "nft", "--timestep_fraction", "0.5"))
    _run(_argv(tiny_wan_dir, wan_embeddings, out["lora"], *GRPO, "--use_lora", "--lora_rank", "4", "--lora_alpha",
               "8"))
    return out


def _latents(pipe):
    pipe.set_progress_bar_config(disable=True)
    latents = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))  # 5 frames at 32 px
    return pipe(prompt="a red fox", negative_prompt="", guidance_scale=5.0, height=32, width=32, num_frames=FRAMES,
                num_inference_steps=2, latents=latents, max_sequence_length=SEQ, output_type="latent").frames


@pytest.mark.slow
def test_wan_grpo_trains_resumes_exactly_and_exports_a_pipeline_folder(tiny_wan_dir, runs, tmp_path):
    from diffusers import WanPipeline

    from fastvideo.training.export import export_checkpoint

    rows, again = read_metrics(runs["grpo"]), read_metrics(runs["resumed"])
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [1, 2]
    for key in ("reward_mean", "loss", "grad_norm"):
        assert rows[1][key] == again[1][key], key
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0  # real updates on clips that differ
    assert rows[0]["forward_passes_rollout"] == 12  # 3 steps x 2 samples x 2 passes (guidance 5.0) per rank
    final = load_file(str(runs["grpo"] / "checkpoint-2" / WEIGHTS))
    again_final = load_file(str(runs["resumed"] / "checkpoint-2" / WEIGHTS))
    assert final.keys() == again_final.keys() and all(torch.equal(final[k], again_final[k]) for k in final)
    base = load_file(str(next((tiny_wan_dir / "transformer").glob("*.safetensors"))))
    assert set(final) == set(base) and any(not torch.equal(final[k], base[k]) for k in base)
    from fastvideo.video_io import read_video

    clips = sorted((runs["grpo"] / "images").glob("step_*/clip_*.mp4"))  # 2 iterations x 2 ranks x 2 samples
    assert len(clips) == 8 and read_video(clips[0]).shape == (FRAMES, 3, 32, 32)  # the trained frames and size
    config = json.loads((runs["grpo"] / "config.json").read_text())
    assert config["model"]["family"] == "wan" and config["plugins"]["wan"]["num_frames"] == FRAMES

    out = export_checkpoint(runs["grpo"] / "checkpoint-2", tmp_path / "export", base=tiny_wan_dir)
    assert json.loads((out / "transformer" / "config.json").read_text())["_class_name"] == "WanTransformer3DModel"
    trained = _latents(WanPipeline.from_pretrained(out))
    stock = _latents(WanPipeline.from_pretrained(tiny_wan_dir))
    assert trained.shape == stock.shape == (1, 16, 2, 4, 4) and not torch.allclose(trained, stock, atol=1e-4)


@pytest.mark.slow
def test_wan_nft_and_lora_train_on_two_ranks(tiny_wan_dir, runs):
    rows = read_metrics(runs["nft"])
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    base = load_file(str(next((tiny_wan_dir / "transformer").glob("*.safetensors"))))
    final = load_file(str(runs["nft"] / "checkpoint-2" / WEIGHTS))
    assert any(not torch.equal(final[k], base[k]) for k in base)
    lora = read_metrics(runs["lora"])
    assert [r["iteration"] for r in lora] == [1, 2] and lora[0]["grad_norm"] > 0
    adapters = load_file(str(runs["lora"] / "checkpoint-2" / "pytorch_lora_weights.safetensors"))
    assert adapters and any("blocks.0.attn1.to_q" in k for k in adapters)
    assert any(float(v.abs().max()) > 0 for k, v in adapters.items() if "lora_B" in k)  # B moved from zero


@pytest.mark.slow
def test_evaluate_samples_the_runs_clip_length_and_takes_num_frames(runs, tmp_path):
    """evaluate on a Wan checkpoint: the clip length the run trained (config.json's "wan" section, 5
    frames), not WanPipeline's default 81; --num_frames given overrides it; a bad one is one line, exit 2."""
    from fastvideo.tools import evaluate
    from fastvideo.video_io import read_video

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red fox\n")
    argv = ["--model", str(runs["grpo"] / "checkpoint-2"), "--prompts", str(prompts), "--rewards", "compressibility",
            "--steps", "2", "--max_sequence_length", str(SEQ)]
    for extra, frames in (((), FRAMES), (("--num_frames", "9"), 9)):
        out = tmp_path / f"eval_{frames}"
        assert evaluate.main([*argv, "--out", str(out), *extra]) == 0
        assert read_video(out / "grid_00.mp4").shape[0] == frames
    with pytest.raises(SystemExit) as exc:
        evaluate.main([*argv, "--out", str(tmp_path / "bad"), "--num_frames", "6"])
    assert exc.value.code == 2


@pytest.mark.parametrize("script", sorted(WAN_LAUNCHERS))
def test_wan_launchers_parse_to_their_peers_configuration(script):
    """Wan2.1-1.3B: DanceGRPO's finetune_wan_2_1_grpo.sh (single frames, HPSv2.1); Wan2.2-TI2V-5B: verl-omni's
    run_wan22_5b_t2v_hpsv3_auto.sh (9 frames at 704x1280); sources in scripts/finetune/wan2{1,2}_grpo_args.sh."""
    from fastvideo.config import build_parser, validate_args

    world, prompts, accumulation = WAN_LAUNCHERS[script]
    argv = launcher_argv(script)
    cfg = validate_args(build_parser(argv).parse_args(argv))
    r, g, m, u = cfg.rollout, cfg.grpo, cfg.mix, cfg.update
    assert cfg.model.family == "wan" and not cfg.lora.enabled and cfg.optim.learning_rate == 1e-5
    assert (g.clip_range, g.adv_clip_max, cfg.optim.max_grad_norm, cfg.optim.weight_decay) == (1e-4, 5.0, 1.0, 1e-4)
    assert r.guidance_scale == 5.0 and m.sde_kind == "dance" and cfg.prompts_per_rank == prompts
    assert u.gradient_accumulation_steps == accumulation
    assert cfg.prompts_per_rank * world == (16 if "wan21" in script else 64)
    if "wan21" in script:  # DanceGRPO: 16 prompts x 12 per iteration, one optimizer step
        assert cfg.plugins["wan"].num_frames == 1
        assert (r.height, r.width, r.sampling_steps, r.eta) == (512, 512, 20, 0.3)
        assert (r.shift, r.quantize_timestep, r.num_generations, r.init_same_noise) == (3.0, True, 12, True)
        assert g.timestep_fraction == 0.6 and m.mode == "full" and not g.global_std
        assert [(s.name, s.weight) for s in cfg.reward.spec] == [("hpsv2", 1.0)]
        assert cfg.derived(world)["optimizer_steps_per_iteration"] == 1
    else:  # verl-omni: 64 prompts x 8 per iteration, 4 optimizer steps (ppo_mini_batch_size 16)
        assert cfg.plugins["wan"].num_frames == 9
        assert (r.height, r.width, r.sampling_steps, r.eta) == (704, 1280, 10, 1.2)
        assert (r.shift, r.quantize_timestep, r.num_generations) == (5.0, False, 8) and g.global_std
        assert (m.mode, m.window_size, m.start_strategy, m.window_range) == ("fast", 2, "random", (0, 5))
        assert cfg.reward.extras.video_reward_frames == "every:4" and cfg.parallel.cpu_offload
        assert u.train_micro_batch_size == 4 and cfg.derived(world)["optimizer_steps_per_iteration"] == 4
        assert (cfg.optim.max_train_steps, cfg.output.checkpointing_steps) == (120, 30)


def test_a_size_the_wan22_vae_cannot_take_is_one_line(tiny_wan_ti2v_dir, wan_ti2v_embeddings, tmp_path, capsys):
    """Wan2.2-TI2V-5B's VAE has 16 pixels a latent cell, so a token is 32 pixels a side: --w 48 (a
    multiple of 16, which the generic check takes) ends with one line naming 32, exit 2, before any
    rollout (before: the start-up profile's ValueError traceback)."""
    from one_line import one_line

    from fastvideo.train_grpo_flux import main

    argv = _argv(tiny_wan_ti2v_dir, wan_ti2v_embeddings, tmp_path / "out", "--w", "48")
    line = one_line(capsys, lambda: main(argv))
    assert "image size 32x48 must be a multiple of 32" in line and "choose --h/--w multiples of 32" in line
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
