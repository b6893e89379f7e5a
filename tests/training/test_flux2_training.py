"""FLUX.2 [klein] through the trainer on 2 gloo ranks, the current library line: after preprocessing,
the 8-GPU launcher's GRPO (classifier-free guidance 4.0, Flow-GRPO's SDE on one drawn step, the
pipeline's own schedule, full fine-tuning) trains the tiny klein for 2 iterations, resumes
bit-exactly and exports a folder Flux2KleinPipeline loads and whose output differs from the base's;
DiffusionNFT and LoRA (on Flow-Factory's klein targets, exported for load_lora_weights) train too.
The launchers, other plans and bad inputs: test_flux2_paths.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from current_line_helpers import SEQ, WEIGHTS, line_reason, tiny_argv
from helpers import read_metrics, torchrun

pytestmark = pytest.mark.skipif(line_reason() is not None, reason=line_reason() or "")


@pytest.fixture(scope="module")
def grpo_runs(tiny_flux2_dir, flux2_embeddings, tmp_path_factory):
    """2 iterations on 2 ranks, then the run resumed from checkpoint-1 (as after a crash in iteration 2)."""
    tmp = tmp_path_factory.mktemp("flux2_grpo")
    straight, resumed = tmp / "straight", tmp / "resumed"
    proc = torchrun(tiny_argv(tiny_flux2_dir, flux2_embeddings, straight), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-2"))
    proc = torchrun(tiny_argv(tiny_flux2_dir, flux2_embeddings, resumed) + ["--resume_from_checkpoint", "latest"],
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
    argv = tiny_argv(tiny_flux2_dir, flux2_embeddings, tmp_path / "nft", algorithm="nft", timestep_fraction=0.5)
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

    argv = tiny_argv(tiny_flux2_dir, flux2_embeddings, tmp_path / "lora", use_lora=True, lora_rank=4,
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
