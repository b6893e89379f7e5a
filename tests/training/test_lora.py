"""LoRA training: flags, upstream's launch line and launchers, 2-rank FSDP / DDP runs, exact resume."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fastvideo.config import ConfigError, build_parser, validate_args
from helpers import ROOT, read_metrics, torchrun

LORA_LAUNCHERS = ["scripts/finetune/finetune_flux_grpo_8gpus_lora.sh",
                  "scripts/finetune/finetune_flux_grpo_a3_16die_lora.sh"]


def _dry_run_argv(script: str, **env_extra) -> list[str]:
    import os

    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root"), **env_extra}
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    words = shlex.split([ln for ln in out.stdout.splitlines() if "train_grpo_flux_lora.py" in ln][-1])
    return words[[i for i, w in enumerate(words) if w.endswith("train_grpo_flux_lora.py")][0] + 1:]


def _validate(argv):
    return validate_args(build_parser().parse_args(["--use_lora", *argv]))


@pytest.mark.parametrize("script", LORA_LAUNCHERS)
def test_lora_launchers_parse_with_upstream_lora_settings(script):
    cfg = _validate(_dry_run_argv(script))
    assert cfg.lora.enabled and cfg.lora.rank == 128 and cfg.lora.alpha == 256 and cfg.lora.scale == 2.0
    assert cfg.lora.target_modules == ("to_k", "to_q", "to_v", "to_out.0")
    assert cfg.optim.learning_rate == 3e-4 and cfg.model.mixed_precision == "bf16"


def test_lora_flag_errors(tmp_path):
    base = ["--data_json_path", "x", "--pretrained_model_name_or_path", "x", "--rewards", "compressibility:1"]
    for bad, words in [(["--lora_rank", "0"], "--lora_rank"), (["--lora_alpha", "-1"], "--lora_alpha"),
                       (["--lora_dropout", "1"], "--lora_dropout"), (["--lora_target_modules", ","], "empty"),
                       (["--resume_from_lora_checkpoint", str(tmp_path)], "pytorch_lora_weights"),
                       (["--kl_coef", "-0.1"], "--kl_coef")]:
        with pytest.raises(ConfigError, match=words):
            _validate(base + bad)
    with pytest.raises(ConfigError, match="needs --use_lora"):
        validate_args(build_parser().parse_args(base + ["--resume_from_lora_checkpoint", "latest"]))
    # A trainer checkpoint (or 'latest') is an exact resume, as --resume_from_checkpoint.
    assert _validate(base + ["--resume_from_lora_checkpoint", "latest"]).output.resume_from_checkpoint == "latest"


def _tiny_upstream_line(json_path, model_dir, out, launcher_env=None, **extra) -> list[str]:
    """Upstream's LoRA launch line (scripts/finetune/finetune_flux_grpo_8gpus_lora.sh) with the
    sizes brought down to the tiny model, paths to the test's, HPSv2 replaced by compressibility;
    ``launcher_env``: more of the launcher's environment (EXTRA_ARGS, LEAN)."""
    argv = _dry_run_argv(LORA_LAUNCHERS[0], MODEL_PATH=str(model_dir), DATA_JSON=str(json_path), OUTPUT_DIR=str(out),
                         **(launcher_env or {}))
    sizes = {"--h": "32", "--w": "32", "--sampling_steps": "4", "--num_generations": "2", "--max_train_steps": "2",
             "--checkpointing_steps": "2", "--gradient_accumulation_steps": "2", "--dataloader_num_workers": "0",
             "--rollout_batch_size": "2", **extra}
    for i, word in enumerate(argv[:-1]):
        if word in sizes:
            argv[i + 1] = sizes.pop(word)
    argv[argv.index("--use_hpsv2")] = "--rewards=compressibility:1.0"
    for k, v in sizes.items():  # flags the line does not have
        argv += [k] if v is True else [k, v]
    return argv + ["--save_images_every", "0"]


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.slow
def test_upstream_lora_line_two_ranks_and_exact_resume(tiny_flux_dir, tiny_embeddings, tmp_path):
    """2 iterations straight == 1 + resume + 1, bit for bit (adapters, their EMA, AdamW state, LR
    schedule, metrics), on 2 gloo ranks under FSDP with a bf16 base, gradient checkpointing, EMA and
    the KL term. The resume is upstream's launch line: --resume_from_lora_checkpoint naming the
    checkpoint folder, which is also a diffusers LoRA folder."""
    from fastvideo.training.checkpoint import read_weights

    straight, split = tmp_path / "straight", tmp_path / "split"
    more = {"--kl_coef": "0.1", "--use_ema": True, "--ema_decay": "0.9", "--checkpointing_steps": "1"}
    run = lambda out, **kw: torchrun(_tiny_upstream_line(tiny_embeddings, tiny_flux_dir, out, **{**more, **kw}),
                                     script="train_grpo_flux_lora.py")
    _ok(run(straight))
    _ok(run(split, **{"--max_train_steps": "1"}))
    _ok(run(split, **{"--resume_from_lora_checkpoint": str(split / "checkpoint-1")}))
    ckpt = straight / "checkpoint-2"
    for name in ("pytorch_lora_weights.safetensors", "ema.safetensors", "optimizer.safetensors"):
        a, b = load_file(str(ckpt / name)), load_file(str(split / "checkpoint-2" / name))
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), f"{name}: resume is not exact"
    assert (ckpt / "scheduler.json").read_text() == (split / "checkpoint-2" / "scheduler.json").read_text()
    adapters = read_weights(ckpt, lora=True)
    assert adapters and all(".lora_A.default." in k or ".lora_B.default." in k for k in adapters)
    assert all(v.dtype == torch.float32 for v in adapters.values())
    assert {v.shape[0] for k, v in adapters.items() if ".lora_A." in k} == {128}
    assert any(v.abs().max() > 0 for k, v in adapters.items() if ".lora_B." in k), "lora_B never moved"
    assert not (ckpt / "diffusion_pytorch_model.safetensors").exists()
    ma, mb = read_metrics(straight), read_metrics(split)
    assert [r["iteration"] for r in mb] == [1, 2]
    assert [r["reward_mean"] for r in ma] == [r["reward_mean"] for r in mb]
    # (two optimizer steps per iteration here, so even iteration 1 has a KL after its first step)
    assert [r["kl"] for r in ma] == [r["kl"] for r in mb] and ma[-1]["kl"] > 0
    info = json.loads((straight / "config.json").read_text())
    assert info["lora"]["enabled"] and info["model"]["mixed_precision"] == "bf16"


@pytest.mark.slow
def test_lora_under_ddp_two_ranks(tiny_flux_dir, tiny_embeddings, tmp_path):
    out = tmp_path / "ddp"
    # DDP through the launcher's EXTRA_ARGS (as a user writes it): the launcher then leaves out its
    # bf16 FSDP gathers (LEAN_ARGS), which DDP would refuse
    argv = _tiny_upstream_line(tiny_embeddings, tiny_flux_dir, out,
                               launcher_env={"EXTRA_ARGS": "--fsdp_sharding_startegy none"}, **{"--kl_coef": "0.1"})
    assert "--fsdp_param_dtype" not in argv and argv[argv.index("--fsdp_sharding_startegy") + 1] == "none"
    _ok(torchrun(argv, script="train_grpo_flux_lora.py"))
    rows = read_metrics(out)
    assert len(rows) == 2 and all(r["grad_norm"] == r["grad_norm"] for r in rows) and rows[-1]["kl"] > 0
    from fastvideo.training.checkpoint import read_weights

    adapters = read_weights(out / "checkpoint-2", lora=True)
    assert any(v.abs().max() > 0 for k, v in adapters.items() if ".lora_B." in k)


def test_fsdp_units_are_uniform(tiny_flux_dir):
    """Every FSDP flat parameter of a LoRA model is all-trainable fp32 or all-frozen bf16 (2 ranks)."""
    from dist_utils import run_distributed

    result = run_distributed(_flat_param_kinds, str(tiny_flux_dir), world_size=2)
    kinds = result[0]
    assert ("trainable", "torch.float32") in kinds and ("frozen", "torch.bfloat16") in kinds
    assert len(kinds) == 2


def _flat_param_kinds(info, model_dir):
    from fastvideo.distributed.fsdp import wrap_model
    from fastvideo.models import flux
    from fastvideo.training.lora import LoraSettings, apply_lora, is_adapter_unit

    model = flux.load_transformer(Path(model_dir), device=info.device, dtype=torch.float32)
    apply_lora(model, LoraSettings(True, 4, 8.0, 0.0, ("to_k", "to_q", "to_v", "to_out.0"), None),
               torch.bfloat16, torch.float32, seed=0)
    wrapped = wrap_model(model, "full", info.device, extra_units=is_adapter_unit)
    return sorted({("trainable" if p.requires_grad else "frozen", str(p.dtype)) for p in wrapped.parameters()})


def test_diffusers_names_and_scale_round_trip(tmp_path):
    """Our export (scale folded in, read at scale 1) and upstream's lora-checkpoint-N folder (raw
    adapters + lora_config.json with its rank / alpha) both read back as the same adapters."""
    from safetensors.torch import save_file

    from fastvideo.training import lora

    g = torch.Generator().manual_seed(0)
    adapters = {"transformer_blocks.0.attn.to_q.lora_A.default.weight": torch.randn(4, 8, generator=g),
                "transformer_blocks.0.attn.to_q.lora_B.default.weight": torch.randn(8, 4, generator=g)}
    exported = lora.to_diffusers(adapters, scale=2.0)
    assert set(exported) == {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight",
                             "transformer.transformer_blocks.0.attn.to_q.lora_B.weight"}
    assert torch.equal(exported["transformer.transformer_blocks.0.attn.to_q.lora_B.weight"],
                       2 * adapters["transformer_blocks.0.attn.to_q.lora_B.default.weight"])
    ours, upstream = tmp_path / "ours", tmp_path / "lora-checkpoint-60-0"
    ours.mkdir(), upstream.mkdir()
    save_file(exported, str(ours / lora.LORA_WEIGHTS_NAME))
    save_file(lora.to_diffusers(adapters, scale=1.0), str(upstream / lora.LORA_WEIGHTS_NAME))  # raw, as upstream
    (upstream / "lora_config.json").write_text(json.dumps({"step": 60, "lora_params": {"lora_rank": 4,
                                                                                       "lora_alpha": 8}}))
    for folder in (ours, upstream):
        back = lora.from_diffusers(lora.read_lora_file(folder), scale=2.0)
        assert set(back) == set(adapters) and all(torch.equal(back[k], adapters[k]) for k in adapters)
    with pytest.raises(ValueError, match="diffusers format"):
        lora.from_diffusers({"lora_unet_x.lora_down.weight": torch.zeros(1)}, 2.0)


def test_merge_into_base_is_w_plus_scale_b_a():
    from fastvideo.training.lora import merge_into_base

    w = torch.randn(6, 5)
    a, b = torch.randn(2, 5), torch.randn(6, 2)
    out = merge_into_base({"blk.to_q.weight": w, "blk.to_q.bias": torch.zeros(6)},
                          {"blk.to_q.lora_A.default.weight": a, "blk.to_q.lora_B.default.weight": b}, 2.0)
    torch.testing.assert_close(out["blk.to_q.weight"], w + 2.0 * b @ a)
    with pytest.raises(ValueError, match="cannot merge"):
        merge_into_base({"blk.to_q.weight": w}, {"blk.to_k.lora_A.default.weight": a,
                                                  "blk.to_k.lora_B.default.weight": b}, 2.0)


@pytest.mark.parametrize("algorithm", ["grpo", "nft"])
def test_lora_layout_does_not_depend_on_the_objective(algorithm):
    """The replicated-base layout (one FSDP unit per block, base outside FSDP) for every objective,
    NFT's swapped old policy included (test_nft_training.py runs it); the per-adapter layout only
    with CPU offload."""
    from fastvideo.training.builders import _replicate_frozen

    base = ["--data_json_path", "x", "--pretrained_model_name_or_path", "x", "--rewards", "compressibility:1",
            "--algorithm", algorithm]
    assert _replicate_frozen(_validate(base))
    assert not _replicate_frozen(_validate(base + ["--use_cpu_offload"]))
    assert not _replicate_frozen(validate_args(build_parser().parse_args(base)))  # no LoRA: nothing to replicate
