"""FLUX.1 Kontext through the trainer on 2 gloo ranks: the 8-GPU launcher's GRPO (Flow-Factory's
flux1_kontext values, tiny overrides) trains 2 iterations on the tiny editing prompt file with its
source images; the reward function receives each sample's source image (a recording reward and the
built-in clip_edit); a resumed run equals the straight one bit for bit; the export loads in the stock
FluxKontextPipeline and changes its output; DiffusionNFT trains too. The current library line (the
stock pipeline and the launchers' line)."""

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

from current_line_helpers import WEIGHTS, line_reason
from edit_helpers import run_recorded
from helpers import ROOT, read_metrics

pytestmark = pytest.mark.skipif(line_reason("FLUX.1 Kontext training") is not None,
                                reason=line_reason("FLUX.1 Kontext training") or "")
LAUNCHER = "scripts/finetune/finetune_kontext_grpo_8gpus.sh"
forked_only = pytest.mark.skipif(os.environ.get("FLUX_GRPO_TEST_REAL_TORCHRUN", "0") == "1",
                                 reason="the recording reward is registered in the test process; forked ranks only")


def launcher_words(script: str = LAUNCHER, **env_extra) -> list[str]:
    env = {"DRY_RUN": "1", "FASTVIDEO_DEVICE": "cpu", "PATH": "/usr/bin:/bin", "PYTHON": sys.executable,
           "HOME": os.environ.get("HOME", "/root"), **env_extra}
    out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return shlex.split(out.stdout.strip().splitlines()[-1])


def _argv(model, index, out, clip_dir, **more) -> list[str]:
    words = launcher_words(LEAN="0")  # the launcher's lean options need bf16 autocast (scripts/common.sh)
    tiny = dict(pretrained_model_name_or_path=model, data_json_path=index, output_dir=out, h=32, w=32,
                sampling_steps=4, num_generations=2, train_batch_size=1, rollout_batch_size=2,
                train_micro_batch_size=2, gradient_accumulation_steps=1, rewards="record_sources:1.0,clip_edit:0.5",
                clip_dir=clip_dir, max_train_steps=2, checkpointing_steps=1, dataloader_num_workers=0,
                save_images_every=0, learning_rate=1e-3, mixed_precision="no")
    tiny.update(more)
    argv = words[words.index("fastvideo/train_grpo_flux.py") + 1:]
    return argv + [w for k, v in tiny.items() for w in (f"--{k}", str(v))]


@pytest.fixture(scope="module")
def grpo_runs(tiny_kontext_dir, kontext_embeddings, tiny_rewards, tmp_path_factory):
    """2 iterations on 2 ranks, then the run resumed from checkpoint-1."""
    tmp = tmp_path_factory.mktemp("kontext_grpo")
    straight, resumed = tmp / "straight", tmp / "resumed"
    run_recorded(_argv(tiny_kontext_dir, kontext_embeddings, straight, tiny_rewards.pickscore_dir), tmp / "record")
    shutil.copytree(straight, resumed, ignore=shutil.ignore_patterns("checkpoint-2"))
    run_recorded(_argv(tiny_kontext_dir, kontext_embeddings, resumed, tiny_rewards.pickscore_dir)
         + ["--resume_from_checkpoint", "latest"], tmp / "record_resumed")
    return straight, resumed, tmp / "record"


def test_launchers_parse_to_flow_factorys_kontext_configuration():
    from diffusers.pipelines.flux.pipeline_flux_kontext import calculate_shift

    from fastvideo.config import build_parser, validate_args

    for script, world, per_rank, accumulation in ((LAUNCHER, 8, 6, 12),
                                                  ("scripts/finetune/finetune_kontext_grpo_a3_16die.sh", 16, 3, 6)):
        words = launcher_words(script)
        assert f"--nproc_per_node={world}" in words
        cfg = validate_args(build_parser().parse_args(words[words.index("fastvideo/train_grpo_flux.py") + 1:]))
        assert cfg.model.family == "kontext" and cfg.rollout.guidance_scale == 2.5 and cfg.rollout.eta == 0.9
        assert (cfg.rollout.height, cfg.rollout.width, cfg.rollout.sampling_steps) == (384, 384, 10)
        # FluxKontextPipeline's at 384 x 384: exp(mu) of its 24 x 24 generated tokens
        assert cfg.rollout.shift == pytest.approx(math.exp(calculate_shift(576)), rel=1e-12)
        assert cfg.prompts_per_rank == per_rank and cfg.update.gradient_accumulation_steps == accumulation


@forked_only
@pytest.mark.slow
def test_kontext_grpo_trains_sees_sources_resumes_exactly_and_exports(tiny_kontext_dir, grpo_runs, tmp_path):
    from diffusers import FluxKontextPipeline

    from fastvideo.data.sources import load_pixels
    from fastvideo.training.export import export_checkpoint

    straight, resumed, record = grpo_runs
    rows, again = read_metrics(straight), read_metrics(resumed)
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [1, 2]
    for key in ("reward_mean", "loss", "grad_norm"):
        assert rows[1][key] == again[1][key], key
    assert rows[0]["grad_norm"] > 0 and rows[0]["reward_std"] > 0
    # The reward function received each sample's own source image (the training file's, exactly).
    calls = [torch.load(p, weights_only=True) for p in sorted(record.glob("rank*-*.pt"))]
    assert {p.name.split("-")[0] for p in record.glob("*.pt")} == {"rank0", "rank1"} and len(calls) == 4
    plist = [json.loads(line) for line in (ROOT / "assets/edit/prompts_edit.jsonl").read_text().splitlines()]
    image_of = {r["prompt"]: ROOT / "assets/edit" / r["image"] for r in plist}
    for call in calls:
        assert call["sources"].shape == (len(call["prompts"]), 3, 64, 64)
        assert torch.equal(call["sources"], load_pixels([image_of[p] for p in call["prompts"]]))
    # clip_edit (which refuses a call without sources) scored every sample: cosines in [-1, 1]
    assert all(-1 <= r["reward/clip_edit_mean"] <= 1 and r["reward/clip_edit_std"] > 0 for r in rows)

    final = load_file(str(straight / "checkpoint-2" / WEIGHTS))
    again_final = load_file(str(resumed / "checkpoint-2" / WEIGHTS))
    assert all(torch.equal(final[k], again_final[k]) for k in final)
    assert json.loads((straight / "config.json").read_text())["model"]["family"] == "kontext"
    out = export_checkpoint(straight / "checkpoint-2", tmp_path / "export", base=tiny_kontext_dir)
    trained, stock = (_edit(FluxKontextPipeline.from_pretrained(p)) for p in (out, tiny_kontext_dir))
    assert trained.shape == stock.shape and not torch.allclose(trained, stock, atol=1e-4)


def _edit(pipe):
    from fastvideo.data.sources import open_rgb

    pipe.set_progress_bar_config(disable=True)
    latents = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0))
    return pipe(image=open_rgb(ROOT / "assets/edit/images/00.png"), prompt="make the square green", height=32,
                width=32, num_inference_steps=2, guidance_scale=2.5, latents=latents, max_sequence_length=32,
                output_type="latent", _auto_resize=False, max_area=32 * 32).images


@forked_only
@pytest.mark.slow
def test_kontext_nft_trains_on_two_ranks(tiny_kontext_dir, kontext_embeddings, tiny_rewards, tmp_path):
    """NFT with 2 prompts a rank scored while the rollout runs (--reward_overlap on): each sample is
    scored with its own prompt's source image (the overlapped scorer's order is the serial one's)."""
    argv = _argv(tiny_kontext_dir, kontext_embeddings, tmp_path / "nft", tiny_rewards.pickscore_dir,
                 algorithm="nft", timestep_fraction=0.5, train_batch_size=2, rollout_batch_size=4,
                 train_micro_batch_size=4, reward_overlap="on")
    for flag in ("--sde_steps", "--sde_start", "--sde_window_range", "--flow_grpo_sampling"):  # GRPO's SDE window
        i = argv.index(flag)
        del argv[i:i + (1 if flag == "--flow_grpo_sampling" else 2)]
    run_recorded(argv, tmp_path / "record")
    rows = read_metrics(tmp_path / "nft")
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    base = load_file(str(next((tiny_kontext_dir / "transformer").glob("*.safetensors"))))
    final = load_file(str(tmp_path / "nft" / "checkpoint-2" / WEIGHTS))
    assert any(not torch.equal(final[k], base[k]) for k in base)
    from fastvideo.data.sources import load_pixels

    plist = [json.loads(line) for line in (ROOT / "assets/edit/prompts_edit.jsonl").read_text().splitlines()]
    image_of = {r["prompt"]: ROOT / "assets/edit" / r["image"] for r in plist}
    prompts = []
    for path in (tmp_path / "record").glob("rank*-*.pt"):
        call = torch.load(path, weights_only=True)
        prompts += call["prompts"]
        assert torch.equal(call["sources"], load_pixels([image_of[p] for p in call["prompts"]]))
    assert len(prompts) == 2 * 2 * 2 * 2 and len(set(prompts)) > 1  # 2 ranks x 2 iterations x 2 prompts x 2 samples
