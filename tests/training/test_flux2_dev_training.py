"""FLUX.2 [dev] (the flux2 family on a Flux2Pipeline folder) through the trainer, the current library
line: both launchers parse to Flow-Factory's FLUX.2-dev configuration; after preprocessing (Mistral-3)
the 8-GPU launcher's GRPO (guidance embedding 4.0 in one pass, Flow-GRPO's SDE on one drawn step, the
pipeline's schedule, full fine-tuning) trains the tiny dev for 2 iterations on 2 gloo ranks, resumes
bit-exactly and exports a folder Flux2Pipeline loads, whose output differs from the base's;
DiffusionNFT and LoRA (exported for load_lora_weights) train too; a dev folder without its text
encoder is refused before any model loads."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from current_line_helpers import DEV_LAUNCHERS, WEIGHTS, launcher_argv, line_reason, tiny_argv
from helpers import read_metrics, torchrun

pytestmark = pytest.mark.skipif(line_reason("FLUX.2 [dev] training") is not None,
                                reason=line_reason("FLUX.2 [dev] training") or "")
SCRIPT = "scripts/finetune/finetune_flux2_dev_grpo_8gpus.sh"
SEQ = 144  # conftest's FLUX2_DEV_SEQ


def dev_argv(model, index, out, **more):
    """The 8-GPU dev launcher's flags, the tiny run's overrides (two rewards: the launcher mixes them)."""
    return tiny_argv(model, index, out, script=SCRIPT, **{"rewards": "compressibility:1.0,detail:0.5", **more})


@pytest.mark.parametrize("script", sorted(DEV_LAUNCHERS))
def test_dev_launchers_parse_to_flow_factorys_flux2_dev_configuration(script):
    from fastvideo.config import build_parser, validate_args
    from fastvideo.models.flux2 import components as C

    world, prompts, accumulation = DEV_LAUNCHERS[script]
    cfg = validate_args(build_parser().parse_args(launcher_argv(script)))
    r, g = cfg.rollout, cfg.grpo
    assert cfg.model.family == "flux2" and (r.height, r.width, r.sampling_steps) == (512, 512, 10)
    assert (r.guidance_scale, r.eta, r.quantize_timestep, r.num_generations) == (4.0, 1.0, False, 16)
    assert r.shift == pytest.approx(C.schedule_shift(512, 512, 10))
    assert cfg.mix.sde_kind == "flow" and cfg.mix.window_range == (1, 4) and cfg.mix.trained_steps(0, 9) == 1
    assert (g.clip_range, g.adv_clip_max, g.kl_coef, g.adv_std) == (1e-4, 5.0, 0.0, "population")
    assert cfg.optim.learning_rate == 1e-5 and not cfg.lora.enabled and cfg.model.gradient_checkpointing
    assert [(s.name, s.weight) for s in cfg.reward.spec] == [("clip", 1.0), ("pickscore", 0.5)]
    assert cfg.reward.extras.multi_reward_mix == "advantage_aggr"
    assert cfg.prompts_per_rank * world == 48 and cfg.update.gradient_accumulation_steps == accumulation
    assert cfg.update.train_micro_batch_size == 1 and cfg.derived(world)["optimizer_steps_per_iteration"] == 2
    assert cfg.cpu_offload == (world == 16)  # the memory verdicts: 16 dies of 64 GB offload by default
    other = validate_args(build_parser().parse_args(launcher_argv(script, OFFLOAD="1" if world == 8 else "0")))
    assert other.cpu_offload == (world == 8)


@pytest.fixture(scope="module")
def grpo_runs(tiny_flux2_dev_dir, flux2_dev_embeddings, tmp_path_factory):
    """2 iterations on 2 ranks, then the run resumed from checkpoint-1."""
    tmp = tmp_path_factory.mktemp("flux2_dev_grpo")
    straight, resumed = tmp / "straight", tmp / "resumed"
    proc = torchrun(dev_argv(tiny_flux2_dev_dir, flux2_dev_embeddings, straight), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-2"))
    proc = torchrun(dev_argv(tiny_flux2_dev_dir, flux2_dev_embeddings, resumed) + ["--resume_from_checkpoint", "latest"],
                    timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return straight, resumed


def _final_latents(pipe):
    latents = torch.randn(1, 128, 2, 2, generator=torch.Generator().manual_seed(0))
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt="a red fox", height=32, width=32, num_inference_steps=2, guidance_scale=4.0, latents=latents,
                max_sequence_length=SEQ, output_type="latent").images


@pytest.mark.slow
def test_dev_grpo_trains_resumes_exactly_and_exports_a_pipeline_folder(tiny_flux2_dev_dir, grpo_runs, tmp_path):
    from diffusers import Flux2Pipeline

    from fastvideo.training.export import export_checkpoint

    straight, resumed = grpo_runs
    rows, again = read_metrics(straight), read_metrics(resumed)
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [1, 2]
    for key in ("reward_mean", "loss", "grad_norm"):
        assert rows[1][key] == again[1][key], key
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0
    assert rows[0]["forward_passes_rollout"] == 8  # 4 steps x 2 samples x 1 pass: the guidance is embedded
    final = load_file(str(straight / "checkpoint-2" / WEIGHTS))
    other = load_file(str(resumed / "checkpoint-2" / WEIGHTS))
    assert final.keys() == other.keys() and all(torch.equal(final[k], other[k]) for k in final)
    base = load_file(str(next((tiny_flux2_dev_dir / "transformer").glob("*.safetensors"))))
    assert set(final) == set(base) and any(not torch.equal(final[k], base[k]) for k in base)
    assert any("guidance_embedder" in k and not torch.equal(final[k], base[k]) for k in base)

    out = export_checkpoint(straight / "checkpoint-2", tmp_path / "export", base=tiny_flux2_dev_dir)
    assert json.loads((out / "model_index.json").read_text())["_class_name"] == "Flux2Pipeline"
    trained = _final_latents(Flux2Pipeline.from_pretrained(out))
    stock = _final_latents(Flux2Pipeline.from_pretrained(tiny_flux2_dev_dir))
    assert trained.shape == stock.shape and not torch.allclose(trained, stock, atol=1e-4)


@pytest.mark.slow
def test_dev_nft_trains_on_two_ranks(tiny_flux2_dev_dir, flux2_dev_embeddings, tmp_path):
    argv = dev_argv(tiny_flux2_dev_dir, flux2_dev_embeddings, tmp_path / "nft", algorithm="nft", timestep_fraction=0.5)
    for flag in ("--sde_steps", "--sde_start", "--sde_window_range", "--flow_grpo_sampling"):  # GRPO's SDE window
        i = argv.index(flag)
        del argv[i:i + (1 if flag == "--flow_grpo_sampling" else 2)]
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = read_metrics(tmp_path / "nft")
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    base = load_file(str(next((tiny_flux2_dev_dir / "transformer").glob("*.safetensors"))))
    final = load_file(str(tmp_path / "nft" / "checkpoint-2" / WEIGHTS))
    assert any(not torch.equal(final[k], base[k]) for k in base)


# Flow-Factory's FLUX.2 LoRA yaml (examples/grpo/lora/flux2/t2i.yaml at 6c7882b): rank 64, alpha 128,
# target_modules "default": its flux2 adapter's attention and MLP projections (the klein list).
DEV_LORA_TARGETS = ("attn.to_q,attn.to_k,attn.to_v,attn.to_out.0,attn.add_q_proj,attn.add_k_proj,attn.add_v_proj,"
                    "attn.to_add_out,ff.linear_in,ff.linear_out,ff_context.linear_in,ff_context.linear_out,"
                    "attn.to_qkv_mlp_proj")


@pytest.mark.slow
def test_dev_lora_trains_and_exports_a_file_the_pipeline_loads(tiny_flux2_dev_dir, flux2_dev_embeddings, tmp_path):
    from diffusers import Flux2Pipeline

    from fastvideo.training.export import export_lora

    argv = dev_argv(tiny_flux2_dev_dir, flux2_dev_embeddings, tmp_path / "lora", use_lora=True, lora_rank=4,
                    lora_alpha=8, lora_target_modules=DEV_LORA_TARGETS)
    argv[argv.index("--use_lora") + 1:argv.index("--use_lora") + 2] = []  # a bare flag: drop its "True"
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    adapters = load_file(str(tmp_path / "lora" / "checkpoint-2" / "pytorch_lora_weights.safetensors"))
    assert any("to_qkv_mlp_proj" in k for k in adapters)
    out = export_lora(tmp_path / "lora" / "checkpoint-2", tmp_path / "lora_export")
    pipe = Flux2Pipeline.from_pretrained(tiny_flux2_dev_dir)
    stock = _final_latents(pipe)
    pipe.load_lora_weights(str(out), weight_name="pytorch_lora_weights.safetensors")
    assert not torch.allclose(_final_latents(pipe), stock, atol=1e-5)


def test_dev_without_its_text_encoder_is_refused_before_any_model_loads(tiny_flux2_dev_dir, flux2_dev_embeddings,
                                                                        tmp_path, monkeypatch):
    from fastvideo.models.flux2 import components as C
    from fastvideo.models.flux2.family import Flux2Family
    from helpers import single_process_trainer, train_args

    broken = shutil.copytree(tiny_flux2_dev_dir, tmp_path / "broken")
    shutil.rmtree(broken / "text_encoder")
    loaded = []
    monkeypatch.setattr(Flux2Family, "load_transformer", lambda *a, **k: loaded.append(1))
    monkeypatch.setattr(Flux2Family, "load_vae", lambda *a, **k: loaded.append(1))
    argv = train_args(flux2_dev_embeddings, broken, tmp_path / "out", model_family="flux2", guidance_scale=4.0,
                      fsdp_sharding_strategy="none")
    with pytest.raises(C.Flux2FolderError, match=r"missing: text_encoder/"):
        single_process_trainer(argv, monkeypatch)
    assert loaded == []
