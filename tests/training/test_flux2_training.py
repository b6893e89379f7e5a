"""FLUX.2 [klein] through the trainer, on the current library line: the launchers' flags (Flow-Factory's
configuration) parse; preprocessing, then the launchers' GRPO (classifier-free guidance 4.0,
Flow-GRPO's SDE on one drawn step, the pipeline's own schedule) trains the tiny klein for 2
iterations on 2 gloo ranks with full fine-tuning, resumes bit-exactly, and exports a folder
Flux2KleinPipeline loads and whose output differs from the base's; DiffusionNFT trains too."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from fastvideo.library_lines import CURRENT, LibraryLineError, require_line
from helpers import ROOT, read_metrics, torchrun


def _line_reason() -> str | None:
    try:
        require_line(CURRENT, "FLUX.2 [klein] training")
    except LibraryLineError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_line_reason() is not None, reason=_line_reason() or "")

LAUNCHERS = {"scripts/finetune/finetune_flux2_klein_grpo_8gpus.sh": (8, 6, 12),
             "scripts/finetune/finetune_flux2_klein_grpo_a3_16die.sh": (16, 3, 6)}
SEQ = 48
WEIGHTS = "diffusion_pytorch_model.safetensors"


def _launcher_argv(script: str, **env_extra) -> list[str]:
    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root"), **env_extra}
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "line: current" in out.stdout  # the dry run names the library line it would run on
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    assert f"--nproc_per_node={LAUNCHERS[script][0]}" in words
    return words[words.index("fastvideo/train_grpo_flux.py") + 1:]


@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_flux2_launchers_parse_to_flow_factorys_klein_configuration(script):
    from fastvideo.config import build_parser, validate_args
    from fastvideo.models.flux2 import components as C

    world, prompts, accumulation = LAUNCHERS[script]
    cfg = validate_args(build_parser().parse_args(_launcher_argv(script)))
    r, g = cfg.rollout, cfg.grpo
    assert cfg.model.family == "flux2" and (r.height, r.width, r.sampling_steps) == (384, 384, 8)
    assert (r.guidance_scale, r.eta, r.quantize_timestep, r.num_generations) == (4.0, 0.7, False, 16)
    assert r.shift == pytest.approx(C.schedule_shift(384, 384, 8)) and r.shift != 3.0  # the pipeline's mu
    assert cfg.mix.sde_kind == "flow" and cfg.mix.window_range == (1, 4) and cfg.mix.trained_steps(0, 7) == 1
    assert (g.clip_range, g.adv_clip_max, g.kl_coef, g.adv_std) == (1e-4, 5.0, 0.0, "population")
    assert cfg.optim.learning_rate == 1e-5 and not cfg.lora.enabled
    assert [s.name for s in cfg.reward.spec] == ["pickscore"]
    assert cfg.prompts_per_rank * world == 48 and cfg.update.gradient_accumulation_steps == accumulation
    assert cfg.derived(world)["optimizer_steps_per_iteration"] == 2  # Flow-Factory: 2 per epoch
    distilled = validate_args(build_parser().parse_args(_launcher_argv(script, KLEIN="distilled")))
    assert (distilled.rollout.sampling_steps, distilled.rollout.guidance_scale, distilled.rollout.eta) == (4, 1.0, 0.5)
    assert distilled.mix.window_range == (1, 3)


@pytest.fixture(scope="module")
def flux2_embeddings(tiny_flux2_dir, tmp_path_factory):
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    out = tmp_path_factory.mktemp("flux2_embeddings")
    cfg = PreprocessConfig(model_path=str(tiny_flux2_dir), prompt_file=str(ROOT / "assets" / "prompts_tiny.txt"),
                           output_dir=str(out), max_sequence_length=SEQ, batch_size=8, dataloader_num_workers=0,
                           model_family="flux2")
    return run_preprocess(cfg).json_path


def _tiny_argv(model, index, out, **more) -> list[str]:
    """The 8-GPU launcher's flags, then the tiny run's overrides (argparse keeps the last value)."""
    tiny = dict(pretrained_model_name_or_path=model, data_json_path=index, output_dir=out, h=32, w=32,
                sampling_steps=4, num_generations=2, train_batch_size=1, rollout_batch_size=2,
                train_micro_batch_size=2, gradient_accumulation_steps=1, rewards="compressibility:1.0",
                max_train_steps=2, checkpointing_steps=1, dataloader_num_workers=0, save_images_every=0,
                learning_rate=1e-3, mixed_precision="no", **more)
    argv = _launcher_argv("scripts/finetune/finetune_flux2_klein_grpo_8gpus.sh")
    return argv + [w for k, v in tiny.items() for w in (f"--{k}", str(v))]


@pytest.fixture(scope="module")
def grpo_runs(tiny_flux2_dir, flux2_embeddings, tmp_path_factory):
    """2 iterations on 2 ranks, then the run resumed from checkpoint-1 (as after a crash in iteration 2)."""
    tmp = tmp_path_factory.mktemp("flux2_grpo")
    straight, resumed = tmp / "straight", tmp / "resumed"
    proc = torchrun(_tiny_argv(tiny_flux2_dir, flux2_embeddings, straight), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-2"))
    proc = torchrun(_tiny_argv(tiny_flux2_dir, flux2_embeddings, resumed) + ["--resume_from_checkpoint", "latest"],
                    timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return straight, resumed


def _final_latents(pipe):
    latents = torch.randn(1, 128, 2, 2, generator=torch.Generator().manual_seed(0))
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt="a red fox", height=32, width=32, num_inference_steps=2, guidance_scale=4.0, latents=latents,
                max_sequence_length=SEQ, output_type="latent").images


@pytest.mark.slow
def test_flux2_grpo_trains_resumes_exactly_and_exports_a_pipeline_folder(tiny_flux2_dir, grpo_runs, tmp_path):
    from diffusers import Flux2KleinPipeline

    from fastvideo.training.export import export_checkpoint

    straight, resumed = grpo_runs
    rows, again = read_metrics(straight), read_metrics(resumed)
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [1, 2]
    for key in ("reward_mean", "loss", "grad_norm"):
        assert rows[1][key] == again[1][key], key
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0  # real updates
    # 4 steps x 2 samples x 2 passes (classifier-free guidance at 4.0) on each rank
    assert rows[0]["forward_passes_rollout"] == 16
    final = load_file(str(straight / "checkpoint-2" / WEIGHTS))
    assert final.keys() == load_file(str(resumed / "checkpoint-2" / WEIGHTS)).keys()
    assert all(torch.equal(final[k], load_file(str(resumed / "checkpoint-2" / WEIGHTS))[k]) for k in final)
    base = load_file(str(next((tiny_flux2_dir / "transformer").glob("*.safetensors"))))
    assert set(final) == set(base) and any(not torch.equal(final[k], base[k]) for k in base)
    config = json.loads((straight / "config.json").read_text())
    assert config["model"]["family"] == "flux2"

    out = export_checkpoint(straight / "checkpoint-2", tmp_path / "export", base=tiny_flux2_dir)
    assert json.loads((out / "transformer" / "config.json").read_text())["_class_name"] == "Flux2Transformer2DModel"
    trained = _final_latents(Flux2KleinPipeline.from_pretrained(out))
    stock = _final_latents(Flux2KleinPipeline.from_pretrained(tiny_flux2_dir))
    assert trained.shape == stock.shape and not torch.allclose(trained, stock, atol=1e-4)


@pytest.mark.slow
def test_flux2_nft_trains_on_two_ranks(tiny_flux2_dir, flux2_embeddings, tmp_path):
    """DiffusionNFT (--algorithm nft: forward-process training on x0, an old policy for the rollout)
    on the tiny klein with guidance: 2 iterations, the weights move."""
    argv = _tiny_argv(tiny_flux2_dir, flux2_embeddings, tmp_path / "nft", algorithm="nft", timestep_fraction=0.5)
    for flag in ("--sde_steps", "--sde_start", "--sde_window_range", "--flow_grpo_sampling"):  # GRPO's SDE window
        i = argv.index(flag)
        del argv[i:i + (1 if flag == "--flow_grpo_sampling" else 2)]
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = read_metrics(tmp_path / "nft")
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    base = load_file(str(next((tiny_flux2_dir / "transformer").glob("*.safetensors"))))
    final = load_file(str(tmp_path / "nft" / "checkpoint-2" / WEIGHTS))
    assert any(not torch.equal(final[k], base[k]) for k in base)


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_flux2_iteration_on_the_npu_paths_does_no_float64(precision, tiny_flux2_dir, flux2_embeddings, tmp_path,
                                                           monkeypatch):
    """One FLUX.2 iteration with classifier-free guidance, the CPU treated as an NPU (stand-in torch_npu):
    the q/k RMSNorms (torch.nn.RMSNorm) take the fused kernel and nothing runs in float64. diffusers
    downcasts FLUX.2's RoPE to float32 itself for NPU tensors (maybe_adjust_dtype_for_device); here the
    CPU stands in for the NPU, so it is told that the CPU is one of those devices too."""
    sys.path.insert(0, str(ROOT / "tests"))
    import npu_stub
    from diffusers.utils import torch_utils
    from float64_guard import NoFloat64OnDevice
    from helpers import single_process_trainer, train_args

    stub = npu_stub.install(monkeypatch)
    unsupported = torch_utils._DTYPE_UNSUPPORTED_DEVICES
    monkeypatch.setitem(unsupported, torch.float64, unsupported[torch.float64] | {"cpu"})
    argv = train_args(flux2_embeddings, tiny_flux2_dir, tmp_path, model_family="flux2", guidance_scale=4.0,
                      flow_grpo_sampling=True, eta=0.7, no_quantize_timestep=True, pipeline_shift=True,
                      mixed_precision=precision, max_train_steps=1, fsdp_sharding_strategy="none", save_images_every=0,
                      reward_overlap="off")
    trainer = single_process_trainer(argv, monkeypatch)
    with NoFloat64OnDevice() as guard:
        record = trainer.run_iteration()
    assert guard.ops > 1000 and record["iteration"] == 1
    assert stub.calls["npu_rms_norm"] > 0
    assert record["forward_passes_rollout"] == 4 * 2 * 2  # steps x samples x (uncond + cond)


def test_a_distilled_klein_with_guidance_is_refused_before_any_model_loads(tiny_flux2_dir, flux2_embeddings,
                                                                             tmp_path, monkeypatch):
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2.family import Flux2Family
    from helpers import single_process_trainer, train_args

    distilled = shutil.copytree(tiny_flux2_dir, tmp_path / "distilled")
    index = json.loads((distilled / "model_index.json").read_text())
    (distilled / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    loaded = []
    monkeypatch.setattr(Flux2Family, "load_transformer", lambda *a, **k: loaded.append(1))
    monkeypatch.setattr(Flux2Family, "load_vae", lambda *a, **k: loaded.append(1))
    argv = train_args(flux2_embeddings, distilled, tmp_path / "out", model_family="flux2", guidance_scale=3.5,
                      fsdp_sharding_strategy="none")
    with pytest.raises(C.Flux2FolderError, match="step-distilled .* pass --guidance_scale 1"):
        single_process_trainer(argv, monkeypatch)
    assert loaded == []


# Flow-Factory's FLUX.2 [klein] LoRA targets (src/flow_factory/models/flux/flux2_klein.py,
# default_target_modules) but its last, "attn.to_out" (the single blocks' output projection): under
# peft's suffix rule that name also matches the double blocks' to_out ModuleList, which peft refuses.
KLEIN_LORA_TARGETS = ("attn.to_q,attn.to_k,attn.to_v,attn.to_out.0,attn.add_q_proj,attn.add_k_proj,attn.add_v_proj,"
                      "attn.to_add_out,ff.linear_in,ff.linear_out,ff_context.linear_in,ff_context.linear_out,"
                      "attn.to_qkv_mlp_proj")


@pytest.mark.slow
def test_flux2_lora_trains_and_exports_a_file_the_pipeline_loads(tiny_flux2_dir, flux2_embeddings, tmp_path):
    from diffusers import Flux2KleinPipeline

    from fastvideo.training.export import export_lora

    argv = _tiny_argv(tiny_flux2_dir, flux2_embeddings, tmp_path / "lora", use_lora=True, lora_rank=4,
                      lora_alpha=8, lora_target_modules=KLEIN_LORA_TARGETS)
    argv[argv.index("--use_lora") + 1:argv.index("--use_lora") + 2] = []  # a bare flag: drop its "True"
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    adapters = load_file(str(tmp_path / "lora" / "checkpoint-2" / "pytorch_lora_weights.safetensors"))
    assert any("to_qkv_mlp_proj" in k for k in adapters) and any("ff_context.linear_in" in k for k in adapters)
    out = export_lora(tmp_path / "lora" / "checkpoint-2", tmp_path / "lora_export")
    pipe = Flux2KleinPipeline.from_pretrained(tiny_flux2_dir)
    stock = _final_latents(pipe)
    pipe.load_lora_weights(str(out), weight_name="pytorch_lora_weights.safetensors")
    assert not torch.allclose(_final_latents(pipe), stock, atol=1e-5)


def test_flux2_mixgrpo_window_with_dpm_and_kl_trains_one_process(tiny_flux2_dir, flux2_embeddings, tmp_path,
                                                                 monkeypatch):
    """The family under the other plans: MixGRPO's SDE window with DPM-Solver++ after it and
    Flow-GRPO's KL to a frozen copy, 2 iterations in one process; the KL is 0 before the first step and
    > 0 after it."""
    from helpers import read_metrics, single_process_trainer, train_args

    argv = train_args(flux2_embeddings, tiny_flux2_dir, tmp_path, model_family="flux2", guidance_scale=4.0,
                      flow_grpo_sampling=True, eta=0.7, no_quantize_timestep=True, pipeline_shift=True,
                      training_strategy="part", group_size=2, dpm_algorithm_type="dpmsolver++", kl_coef=0.01,
                      fsdp_sharding_strategy="none", save_images_every=0, reward_overlap="off", checkpointing_steps=2)
    single_process_trainer(argv, monkeypatch).train()
    rows = read_metrics(tmp_path)
    assert [r["iteration"] for r in rows] == [1, 2] and rows[0]["kl"] == 0.0 and rows[1]["kl"] > 0.0
    assert all(r["grad_norm"] > 0 for r in rows)


def test_demo_model_flux2_dry_run_parses_to_the_tiny_klein_run():
    from fastvideo.config import build_parser, validate_args
    from fastvideo.models.flux2 import components as C

    env = {"DRY_RUN": "1", "MODEL": "flux2", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root")}
    out = subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "line: current" in out.stdout
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    cfg = validate_args(build_parser().parse_args(words[words.index("fastvideo/train_grpo_flux.py") + 1:]))
    assert cfg.model.family == "flux2" and cfg.rollout.guidance_scale == 4.0 and cfg.mix.sde_kind == "flow"
    assert cfg.rollout.shift == pytest.approx(C.schedule_shift(64, 64, 8)) and cfg.optim.learning_rate == 1e-2
    assert cfg.model.pretrained_model_name_or_path == "data/demo/tiny_flux2"
    bad = subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], capture_output=True, text=True,
                         env={**env, "LINE": "recipe"}, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "MODEL=flux2 runs on the current library line" in bad.stderr
