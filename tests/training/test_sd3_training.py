"""SD3.5 through the trainer: the Flow-GRPO launchers' flags train the tiny SD3.5 for 2 iterations
on 2 gloo ranks (LoRA as the launchers, and full fine-tuning), resume bit-exactly, and export
folders / LoRA files that diffusers' StableDiffusion3Pipeline loads and whose output differs from
the base model's."""

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

from helpers import ROOT, read_metrics, torchrun

LAUNCHERS = {"scripts/finetune/finetune_sd3_grpo_8gpus.sh": 8, "scripts/finetune/finetune_sd3_grpo_a3_16die.sh": 16}
SEQ = 16


def _launcher_argv(script: str, **env_extra) -> list[str]:
    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root"), **env_extra}
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    assert f"--nproc_per_node={LAUNCHERS[script]}" in words
    return words[words.index("fastvideo/train_grpo_flux.py") + 1:]


@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_sd3_launchers_parse_to_flow_grpos_pickscore_configuration(script):
    from fastvideo.config import build_parser, validate_args

    cfg = validate_args(build_parser().parse_args(_launcher_argv(script)))
    r, g = cfg.rollout, cfg.grpo
    assert cfg.model.family == "sd3" and (r.height, r.width, r.sampling_steps) == (512, 512, 10)
    assert (r.guidance_scale, r.eta, r.shift, r.quantize_timestep, r.num_generations) == (4.5, 0.7, 3.0, False, 24)
    assert (r.sigma_grid, r.decode_from) == ("diffusers", "final_sample")  # sd3_pipeline_with_logprob.py
    assert cfg.mix.sde_kind == "flow" and g.kl_coef == 0.01 and g.trained_steps(10) == 9  # train.beta
    assert cfg.lora.enabled and (cfg.lora.rank, cfg.lora.alpha) == (32, 64.0) and len(cfg.lora.target_modules) == 8
    assert [s.name for s in cfg.reward.spec] == ["pickscore"]
    assert cfg.derived(LAUNCHERS[script])["optimizer_steps_per_iteration"] == 2  # Flow-GRPO: 2 per epoch


@pytest.fixture(scope="module")
def sd3_embeddings(tiny_sd3_dir, tmp_path_factory):
    from fastvideo.data_preprocess.embeddings import PreprocessConfig, run_preprocess

    out = tmp_path_factory.mktemp("sd3_embeddings")
    cfg = PreprocessConfig(model_path=str(tiny_sd3_dir), prompt_file=str(ROOT / "assets" / "prompts_tiny.txt"),
                           output_dir=str(out), max_sequence_length=SEQ, batch_size=8, dataloader_num_workers=0,
                           model_family="sd3")
    return run_preprocess(cfg).json_path


def _tiny_argv(model, index, out, lora: bool) -> list[str]:
    """The 8-GPU launcher's flags, then the tiny run's overrides (argparse keeps the last value)."""
    argv = _launcher_argv("scripts/finetune/finetune_sd3_grpo_8gpus.sh", LEAN="0")  # the tiny runs as before
    if not lora:  # full fine-tuning: drop the LoRA flags
        for flag in ("--lora_rank", "--lora_alpha", "--lora_target_modules"):
            i = argv.index(flag)
            del argv[i:i + 2]
        argv.remove("--use_lora")
    tiny = dict(pretrained_model_name_or_path=model, data_json_path=index, output_dir=out, h=32, w=32,
                sampling_steps=4, num_generations=2, rollout_batch_size=2, train_micro_batch_size=2,
                gradient_accumulation_steps=1, rewards="compressibility:1.0", max_train_steps=2,
                checkpointing_steps=1, dataloader_num_workers=0, save_images_every=0, learning_rate=1e-3,
                timestep_fraction=0.5)
    return argv + [w for k, v in tiny.items() for w in (f"--{k}", str(v))]


def _train_and_resume(model, index, tmp_path, lora: bool):
    """2 iterations, then the run resumed from checkpoint-1 (as after a crash during iteration 2)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    proc = torchrun(_tiny_argv(model, index, straight, lora), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-2"))
    proc = torchrun(_tiny_argv(model, index, resumed, lora) + ["--resume_from_checkpoint", "latest"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return straight, resumed


def _assert_exact_resume(straight, resumed, weights: str):
    rows, again = read_metrics(straight), read_metrics(resumed)
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [1, 2]
    for key in ("reward_mean", "loss", "grad_norm", "kl"):
        assert rows[1][key] == again[1][key], key
    # Flow-GRPO's KL (the launchers' --kl_coef 0.01): 0 before the first optimizer step, then > 0
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] > 0.0
    a, b = load_file(str(straight / "checkpoint-2" / weights)), load_file(str(resumed / "checkpoint-2" / weights))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    # 4 steps x 2 samples x 2 passes (classifier-free guidance at 4.5) on each rank
    assert rows[0]["forward_passes_rollout"] == 16
    return a


def _final_latents(pipe):
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 16, 4, 4, generator=g)
    pipe.set_progress_bar_config(disable=True)
    return pipe("a red fox", height=32, width=32, num_inference_steps=2, guidance_scale=4.5, latents=latents,
                max_sequence_length=SEQ, output_type="latent").images


@pytest.fixture(scope="module")
def full_runs(tiny_sd3_dir, sd3_embeddings, tmp_path_factory):
    """The full fine-tuning run on 2 ranks and its resumed copy: shared by the resume / export test
    and the 1-rank = 2-rank test."""
    return _train_and_resume(tiny_sd3_dir, sd3_embeddings, tmp_path_factory.mktemp("sd3_full"), lora=False)


@pytest.mark.slow
def test_sd3_full_fine_tuning_trains_resumes_exactly_and_exports_a_pipeline_folder(tiny_sd3_dir, full_runs,
                                                                                    tmp_path):
    from diffusers import StableDiffusion3Pipeline

    from fastvideo.training.export import export_checkpoint

    straight, resumed = full_runs
    final = _assert_exact_resume(straight, resumed, "diffusion_pytorch_model.safetensors")
    base = load_file(str(next((tiny_sd3_dir / "transformer").glob("*.safetensors"))))
    assert set(final) == set(base) and any(not torch.equal(final[k], base[k]) for k in base)
    assert json.loads((straight / "config.json").read_text())["model"]["family"] == "sd3"

    out = export_checkpoint(straight / "checkpoint-2", tmp_path / "export", base=tiny_sd3_dir)
    assert json.loads((out / "transformer" / "config.json").read_text())["_class_name"] == "SD3Transformer2DModel"
    trained = _final_latents(StableDiffusion3Pipeline.from_pretrained(out))
    stock = _final_latents(StableDiffusion3Pipeline.from_pretrained(tiny_sd3_dir))
    assert trained.shape == stock.shape and not torch.allclose(trained, stock, atol=1e-4)


@pytest.mark.slow
def test_sd3_one_rank_equals_two_ranks(tiny_sd3_dir, sd3_embeddings, full_runs, tmp_path, monkeypatch):
    """The 2-rank full fine-tuning run (guidance 4.5, Flow-GRPO's SDE and KL, bf16 autocast) again in
    this process as one rank holding both ranks' prompts (train_batch_size 2) with the same
    micro-batches (2 samples, accumulated over 2: one optimizer step per iteration): the same
    samples (noise by global sample id), rewards, advantages and updates, for 2 iterations (Adam's
    first step is lr x sign(g), so the second is the one that tests the gradients' size). Measured
    on a 2-core AMD EPYC: the metrics agree to 2e-7 relative and the weights after 2 steps bit for
    bit (2 ranks average their two micro-batch gradients, one rank sums their halves: the same
    sums); the tolerances (1e-4 relative) leave room for another reduction order."""
    from helpers import single_process_trainer

    single = tmp_path / "single"
    argv = _tiny_argv(tiny_sd3_dir, sd3_embeddings, single, lora=False) + [
        "--train_batch_size", "2", "--gradient_accumulation_steps", "2"]
    single_process_trainer(argv, monkeypatch).train()
    ones, twos = read_metrics(single), read_metrics(full_runs[0])
    assert len(ones) == len(twos) == 2
    worst = 0.0
    for one, two in zip(ones, twos):
        for key in ("reward_mean", "reward_std", "loss", "grad_norm", "ratio_mean", "kl"):
            assert one[key] == pytest.approx(two[key], rel=1e-4, abs=1e-9), (one["iteration"], key, one[key], two[key])
            worst = max(worst, abs(one[key] - two[key]) / max(abs(two[key]), 1e-12))
    assert ones[1]["kl"] > 0 and ones[0]["grad_norm"] > 0 and ones[0]["reward_std"] > 0  # real updates
    weights = "diffusion_pytorch_model.safetensors"
    a = load_file(str(full_runs[0] / "checkpoint-2" / weights))
    b = load_file(str(single / "checkpoint-2" / weights))
    base = load_file(str(next((tiny_sd3_dir / "transformer").glob("*.safetensors"))))
    assert set(a) == set(b)
    moved = max(float((a[k].float() - base[k].float()).abs().max()) for k in a)
    gap = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    print(f"1 rank vs 2 ranks: metrics differ by <= {worst:.1e} relative; weights moved up to {moved:.2e} "
          f"in 2 steps and differ by up to {gap:.2e}")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
    assert gap < 1e-2 * moved  # the steps themselves agree, not only the untouched weights


@pytest.mark.slow
def test_sd3_lora_trains_resumes_exactly_and_exports_a_diffusers_lora_file(tiny_sd3_dir, sd3_embeddings, tmp_path):
    from diffusers import StableDiffusion3Pipeline

    from fastvideo.training.export import export_lora

    straight, resumed = _train_and_resume(tiny_sd3_dir, sd3_embeddings, tmp_path, lora=True)
    adapters = _assert_exact_resume(straight, resumed, "pytorch_lora_weights.safetensors")
    assert any("add_q_proj" in k for k in adapters) and any("to_add_out" in k for k in adapters)

    out = export_lora(straight / "checkpoint-2", tmp_path / "lora")
    pipe = StableDiffusion3Pipeline.from_pretrained(tiny_sd3_dir)
    stock = _final_latents(pipe)
    pipe.load_lora_weights(str(out), weight_name="pytorch_lora_weights.safetensors")
    assert not torch.allclose(_final_latents(pipe), stock, atol=1e-5)


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_sd3_iteration_on_the_npu_paths_does_no_float64(precision, tiny_sd3_dir, sd3_embeddings, tmp_path,
                                                         monkeypatch):
    """One SD3.5 iteration with classifier-free guidance, the CPU treated as an NPU (stand-in
    torch_npu): SD3.5's q/k RMSNorms take the fused kernel, and nothing runs in float64."""
    sys.path.insert(0, str(ROOT / "tests"))
    import npu_stub
    from float64_guard import NoFloat64OnDevice
    from helpers import single_process_trainer, train_args

    stub = npu_stub.install(monkeypatch)
    argv = train_args(sd3_embeddings, tiny_sd3_dir, tmp_path, model_family="sd3", guidance_scale=4.5,
                      flow_grpo_sampling=True, eta=0.7, no_quantize_timestep=True, mixed_precision=precision,
                      max_train_steps=1, fsdp_sharding_strategy="none", save_images_every=0, reward_overlap="off")
    trainer = single_process_trainer(argv, monkeypatch)
    with NoFloat64OnDevice() as guard:
        record = trainer.run_iteration()
    assert guard.ops > 1000 and record["iteration"] == 1
    assert stub.calls["npu_rms_norm"] > 0
    assert record["forward_passes_rollout"] == 4 * 2 * 2  # steps x samples x (uncond + cond)


def test_demo_model_sd3_dry_run_parses_to_the_tiny_sd3_run():
    from fastvideo.config import build_parser, validate_args

    env = {"DRY_RUN": "1", "MODEL": "sd3", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root")}
    out = subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout.strip().splitlines()[-1])
    cfg = validate_args(build_parser().parse_args(words[words.index("fastvideo/train_grpo_flux.py") + 1:]))
    assert cfg.model.family == "sd3" and cfg.rollout.guidance_scale == 4.5 and cfg.mix.sde_kind == "flow"
    assert cfg.model.pretrained_model_name_or_path == "data/demo/tiny_sd3"
    bad = subprocess.run(["bash", str(ROOT / "scripts/demo/grpo_tiny_cpu.sh")], capture_output=True, text=True,
                         env={**env, "MODEL": "sd4"}, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "MODEL=sd4" in bad.stderr
