"""FLUX.2 [klein] in the trainer beyond the 2-rank runs (test_flux2_training.py), the current library
line: the launchers parse to Flow-Factory's configuration, the MODEL=flux2 demo's command line, a
MixGRPO window with DPM-Solver++ and Flow-GRPO's KL, an iteration on the NPU paths without float64,
and a distilled klein with guidance refused before any model loads."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import torch

from current_line_helpers import LAUNCHERS, launcher_argv, line_reason
from helpers import ROOT

pytestmark = pytest.mark.skipif(line_reason() is not None, reason=line_reason() or "")


@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_flux2_launchers_parse_to_flow_factorys_klein_configuration(script):
    from fastvideo.config import build_parser, validate_args
    from fastvideo.models.flux2 import components as C

    world, prompts, accumulation = LAUNCHERS[script]
    cfg = validate_args(build_parser().parse_args(launcher_argv(script)))
    r, g = cfg.rollout, cfg.grpo
    # Flow-Factory's klein yamls train editing (an instruction and a source image per sample)
    assert cfg.model.family == "flux2_edit" and (r.height, r.width, r.sampling_steps) == (384, 384, 8)
    assert cfg.data_json_path == "data/rl_embeddings_flux2_edit/videos2caption.json"
    t2i = validate_args(build_parser().parse_args(launcher_argv(script, KLEIN_TASK="t2i")))
    assert t2i.model.family == "flux2" and t2i.data_json_path == "data/rl_embeddings_flux2/videos2caption.json"
    assert (r.guidance_scale, r.eta, r.quantize_timestep, r.num_generations) == (4.0, 0.7, False, 16)
    assert r.shift == pytest.approx(C.schedule_shift(384, 384, 8)) and r.shift != 3.0  # the pipeline's mu
    assert cfg.mix.sde_kind == "flow" and cfg.mix.window_range == (1, 4) and cfg.mix.trained_steps(0, 7) == 1
    assert (g.clip_range, g.adv_clip_max, g.kl_coef, g.adv_std) == (1e-4, 5.0, 0.0, "population")
    assert cfg.optim.learning_rate == 1e-5 and not cfg.lora.enabled
    assert [s.name for s in cfg.reward.spec] == ["pickscore"]
    assert cfg.prompts_per_rank * world == 48 and cfg.update.gradient_accumulation_steps == accumulation
    assert cfg.derived(world)["optimizer_steps_per_iteration"] == 2  # Flow-Factory: 2 per epoch
    distilled = validate_args(build_parser().parse_args(launcher_argv(script, KLEIN="distilled")))
    assert (distilled.rollout.sampling_steps, distilled.rollout.guidance_scale, distilled.rollout.eta) == (4, 1.0, 0.5)
    assert distilled.mix.window_range == (1, 3)


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


@pytest.mark.parametrize("script, world", [("scripts/finetune/finetune_flux2_klein_nft_8gpus.sh", "8"),
                                           ("scripts/finetune/finetune_flux2_klein_nft_a3_16die.sh", "16")])
def test_klein_nft_launchers_train_the_editing_task_unless_told_t2i(script, world):
    """Flow-Factory's klein NFT yaml trains on an editing set (instructions with source images), as its
    GRPO yamls: KLEIN_TASK=edit (the default) is --model_family flux2_edit, t2i the text-to-image family."""

    from fastvideo.config import build_parser, validate_args

    for task, family in (("edit", "flux2_edit"), ("t2i", "flux2")):
        env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
               "HOME": os.environ.get("HOME", "/root"), **({"KLEIN_TASK": task} if task == "t2i" else {})}
        out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        words = shlex.split(out.stdout.strip().splitlines()[-1])
        assert f"--nproc_per_node={world}" in words
        cfg = validate_args(build_parser().parse_args(words[words.index("fastvideo/train_grpo_flux.py") + 1:]))
        assert cfg.model.family == family and cfg.algorithm == "nft"
        assert cfg.data_json_path == f"data/rl_embeddings_{family}/videos2caption.json"
