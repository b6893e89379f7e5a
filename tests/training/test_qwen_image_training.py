"""Qwen-Image through the trainer on 2 gloo ranks, the current library line: after preprocessing, the
8-GPU launcher's GRPO (true CFG 4.0 with the negative " ", Flow-GRPO's SDE on one drawn step, the
pipeline's size-dependent shift, full fine-tuning under FSDP with activation checkpointing) trains the
tiny Qwen-Image for 2 iterations, resumes bit-exactly and exports a folder QwenImagePipeline loads and
whose output differs from the base's; DiffusionNFT and LoRA (on Flow-Factory's Qwen-Image targets,
exported for load_lora_weights) train too; the launchers parse to Flow-Factory's configuration; the
MODEL=qwen_image demo's command line; an iteration on the NPU paths."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from current_line_helpers import SEQ, WEIGHTS, QWEN_IMAGE_LAUNCHERS, launcher_argv, line_reason, tiny_argv
from helpers import ROOT, read_metrics, torchrun

pytestmark = pytest.mark.skipif(line_reason("Qwen-Image training") is not None,
                                reason=line_reason("Qwen-Image training") or "")
LAUNCHER = "scripts/finetune/finetune_qwen_image_grpo_8gpus.sh"


def _argv(model, index, out, **more):
    return tiny_argv(model, index, out, script=LAUNCHER, **more)


@pytest.fixture(scope="module")
def grpo_runs(tiny_qwen_image_dir, qwen_image_embeddings, tmp_path_factory):
    """2 iterations on 2 ranks, then the run resumed from checkpoint-1 (as after a crash in iteration 2)."""
    tmp = tmp_path_factory.mktemp("qwen_image_grpo")
    straight, resumed = tmp / "straight", tmp / "resumed"
    proc = torchrun(_argv(tiny_qwen_image_dir, qwen_image_embeddings, straight), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-2"))
    proc = torchrun(_argv(tiny_qwen_image_dir, qwen_image_embeddings, resumed) + ["--resume_from_checkpoint", "latest"],
                    timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return straight, resumed


def _final_latents(pipe):
    latents = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0))  # 32 px: 2 x 2 packed tokens
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt="a red fox", negative_prompt=" ", true_cfg_scale=4.0, height=32, width=32, num_inference_steps=2,
                latents=latents, max_sequence_length=SEQ, output_type="latent").images


@pytest.mark.slow
def test_qwen_image_grpo_trains_resumes_exactly_and_exports_a_pipeline_folder(tiny_qwen_image_dir, grpo_runs, tmp_path):
    from diffusers import QwenImagePipeline

    from fastvideo.training.export import export_checkpoint

    straight, resumed = grpo_runs
    rows, again = read_metrics(straight), read_metrics(resumed)
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [1, 2]
    for key in ("reward_mean", "loss", "grad_norm"):
        assert rows[1][key] == again[1][key], key
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0  # real updates
    assert rows[0]["forward_passes_rollout"] == 16  # 4 steps x 2 samples x 2 passes (guidance 4.0) per rank
    final = load_file(str(straight / "checkpoint-2" / WEIGHTS))
    again_final = load_file(str(resumed / "checkpoint-2" / WEIGHTS))
    assert final.keys() == again_final.keys() and all(torch.equal(final[k], again_final[k]) for k in final)
    base = load_file(str(next((tiny_qwen_image_dir / "transformer").glob("*.safetensors"))))
    assert set(final) == set(base) and any(not torch.equal(final[k], base[k]) for k in base)
    assert json.loads((straight / "config.json").read_text())["model"]["family"] == "qwen_image"

    out = export_checkpoint(straight / "checkpoint-2", tmp_path / "export", base=tiny_qwen_image_dir)
    assert json.loads((out / "transformer" / "config.json").read_text())["_class_name"] == "QwenImageTransformer2DModel"
    trained = _final_latents(QwenImagePipeline.from_pretrained(out))
    stock = _final_latents(QwenImagePipeline.from_pretrained(tiny_qwen_image_dir))
    assert trained.shape == stock.shape and not torch.allclose(trained, stock, atol=1e-4)


@pytest.mark.slow
def test_qwen_image_nft_trains_on_two_ranks(tiny_qwen_image_dir, qwen_image_embeddings, tmp_path):
    """DiffusionNFT (forward-process training on x0, an old policy for the rollout) on the tiny
    Qwen-Image with true CFG: 2 iterations, the weights move."""
    argv = _argv(tiny_qwen_image_dir, qwen_image_embeddings, tmp_path / "nft", algorithm="nft", timestep_fraction=0.5)
    for flag in ("--sde_steps", "--sde_start", "--sde_window_range", "--flow_grpo_sampling"):  # GRPO's SDE window
        i = argv.index(flag)
        del argv[i:i + (1 if flag == "--flow_grpo_sampling" else 2)]
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = read_metrics(tmp_path / "nft")
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    base = load_file(str(next((tiny_qwen_image_dir / "transformer").glob("*.safetensors"))))
    final = load_file(str(tmp_path / "nft" / "checkpoint-2" / WEIGHTS))
    assert any(not torch.equal(final[k], base[k]) for k in base)


# Flow-Factory's Qwen-Image LoRA targets (src/flow_factory/models/qwen_image/qwen_image.py at c4c078c,
# default_target_modules; its "img_mlp.net.2.proj" / "txt_mlp.net.2.proj" name no module: net.2 is the Linear).
QWEN_IMAGE_LORA_TARGETS = ("attn.to_k,attn.to_q,attn.to_v,attn.to_out.0,attn.add_q_proj,attn.add_k_proj,"
                           "attn.add_v_proj,attn.to_add_out,img_mlp.net.0.proj,img_mlp.net.2,txt_mlp.net.0.proj,"
                           "txt_mlp.net.2")


@pytest.mark.slow
def test_qwen_image_lora_trains_and_exports_a_file_the_pipeline_loads(tiny_qwen_image_dir, qwen_image_embeddings, tmp_path):
    from diffusers import QwenImagePipeline

    from fastvideo.training.export import export_lora

    argv = _argv(tiny_qwen_image_dir, qwen_image_embeddings, tmp_path / "lora", use_lora=True, lora_rank=4,
                 lora_alpha=8, lora_target_modules=QWEN_IMAGE_LORA_TARGETS)
    argv[argv.index("--use_lora") + 1:argv.index("--use_lora") + 2] = []  # a bare flag: drop its "True"
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    adapters = load_file(str(tmp_path / "lora" / "checkpoint-2" / "pytorch_lora_weights.safetensors"))
    assert any("add_k_proj" in k for k in adapters) and any("txt_mlp.net.2" in k for k in adapters)
    out = export_lora(tmp_path / "lora" / "checkpoint-2", tmp_path / "lora_export")
    pipe = QwenImagePipeline.from_pretrained(tiny_qwen_image_dir)
    stock = _final_latents(pipe)
    pipe.load_lora_weights(str(out), weight_name="pytorch_lora_weights.safetensors")
    assert not torch.allclose(_final_latents(pipe), stock, atol=1e-5)


@pytest.mark.parametrize("script", sorted(QWEN_IMAGE_LAUNCHERS))
def test_qwen_image_launchers_parse_to_flow_factorys_configuration(script):
    from fastvideo.config import build_parser, validate_args
    from fastvideo.models.qwen_image import components as C

    world, prompts, accumulation = QWEN_IMAGE_LAUNCHERS[script]
    cfg = validate_args(build_parser().parse_args(launcher_argv(script)))
    r, g = cfg.rollout, cfg.grpo
    assert cfg.model.family == "qwen_image" and (r.height, r.width, r.sampling_steps) == (384, 384, 10)
    assert (r.guidance_scale, r.eta, r.quantize_timestep, r.num_generations) == (4.0, 1.0, False, 16)
    assert r.shift == pytest.approx(math.exp(C.calculate_mu(24 * 24)), rel=1e-12) and 1.67 < r.shift < 1.68
    assert cfg.mix.sde_kind == "flow" and cfg.mix.window_range == (1, 4) and cfg.mix.trained_steps(0, 9) == 1
    assert (g.clip_range, g.adv_clip_max, g.kl_coef, g.adv_std) == (1e-4, 5.0, 0.0, "population")
    assert cfg.optim.learning_rate == 1e-5 and not cfg.lora.enabled
    assert [(s.name, s.weight) for s in cfg.reward.spec] == [("clip", 1.0), ("pickscore", 0.5)]
    # FF's advantage_aggregation "gdpo": each reward normalised in its group before the weights (#50 item 3)
    assert cfg.reward.extras.multi_reward_mix == "advantage_aggr"
    assert cfg.prompts_per_rank * world == 48 and cfg.update.gradient_accumulation_steps == accumulation
    assert cfg.derived(world)["optimizer_steps_per_iteration"] == 2  # Flow-Factory: 2 per epoch


def test_demo_model_qwen_image_dry_run_parses_to_the_tiny_run():
    from fastvideo.config import build_parser, validate_args

    env = {"DRY_RUN": "1", "MODEL": "qwen_image", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root")}
    out = subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "line: current" in out.stdout
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    cfg = validate_args(build_parser().parse_args(words[words.index("fastvideo/train_grpo_flux.py") + 1:]))
    assert cfg.model.family == "qwen_image" and cfg.rollout.guidance_scale == 4.0 and cfg.mix.sde_kind == "flow"
    assert not cfg.rollout.quantize_timestep
    assert cfg.model.pretrained_model_name_or_path == "data/demo/tiny_qwen_image"
    bad = subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], capture_output=True, text=True,
                         env={**env, "LINE": "recipe"}, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "MODEL=qwen_image runs on the current library line" in bad.stderr


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_qwen_image_iteration_on_the_npu_paths(precision, tiny_qwen_image_dir, qwen_image_embeddings, tmp_path,
                                               monkeypatch):
    """One Qwen-Image iteration with true CFG, the CPU treated as an NPU (stand-in torch_npu): every RMS
    norm takes the fused kernel, the attention the adapter's processor (real-arithmetic RoPE from CPU
    tables, masked fused attention), and nothing on the device runs in float64 or on complex numbers."""
    sys.path.insert(0, str(ROOT / "tests"))
    import npu_stub
    from float64_guard import NoFloat64OnDevice
    from helpers import single_process_trainer, train_args

    from fastvideo.models.qwen_image.npu import NpuQwenRope

    stub = npu_stub.install(monkeypatch)
    argv = train_args(qwen_image_embeddings, tiny_qwen_image_dir, tmp_path, model_family="qwen_image",
                      guidance_scale=4.0, flow_grpo_sampling=True, eta=1.0, no_quantize_timestep=True,
                      mixed_precision=precision, max_train_steps=1, fsdp_sharding_strategy="none",
                      save_images_every=0, reward_overlap="off")
    trainer = single_process_trainer(argv, monkeypatch)
    with NoFloat64OnDevice(cpu_only=[NpuQwenRope.forward]) as guard:
        record = trainer.run_iteration()
    assert guard.ops > 1000 and record["iteration"] == 1
    assert stub.calls["npu_rms_norm"] > 0
    assert record["forward_passes_rollout"] == 4 * 2 * 2  # steps x samples x (cond + uncond)
