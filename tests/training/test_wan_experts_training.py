"""Wan2.2-A14B's two experts through the trainer on 2 gloo ranks (the current library line, the tiny
two-expert folder of make_tiny_wan --variant a14b, 5-frame clips, guidance 4.0 high / 3.0 low):
GRPO trains 2 iterations with each --train_experts choice (high,low under FSDP1 with EMA, high under
FSDP2, low under FSDP1); the frozen expert's weights stay bit-unchanged and the trained one's move;
a resume from checkpoint-1 equals the straight run; the export of a two-expert checkpoint with --base
loads in stock WanPipeline with boundary_ratio 0.875 and samples otherwise than the base; a LoRA run
on the low-noise expert exports its adapter file (stock load_lora_weights) and merged folders. A
--train_experts / --guidance_scale_2 for a one-expert folder is one line (exit 2). One module of runs."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from current_line_helpers import WAN_A14B_LAUNCHERS, WEIGHTS, launcher_argv, line_reason
from helpers import read_metrics, torchrun
from test_wan_training import GRPO
from test_wan_training import _argv as wan_argv

pytestmark = pytest.mark.skipif(line_reason("Wan training") is not None, reason=line_reason("Wan training") or "")
FRAMES, SEQ = 5, 32
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"


def _argv(model, index, out, *extra):
    """Wan's training flags (test_wan_training._argv) with each expert's guidance scale and GRPO's SDE."""
    return wan_argv(model, index, out, "--guidance_scale", "4.0", "--guidance_scale_2", "3.0", *GRPO, *extra)


def _run(argv):
    proc = torchrun(argv, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tiny_wan_a14b_dir, wan_embeddings, tmp_path_factory):
    """The tiny Wan2.1's embeddings serve: the a14b folder's umT5 is the same network (same seed and config)."""
    tmp = tmp_path_factory.mktemp("wan_a14b_runs")
    out = {name: tmp / name for name in ("both", "resumed", "high", "low", "lora")}
    _run(_argv(tiny_wan_a14b_dir, wan_embeddings, out["both"], "--use_ema"))
    shutil.copytree(out["both"], out["resumed"], ignore=shutil.ignore_patterns("checkpoint-2"))
    _run(_argv(tiny_wan_a14b_dir, wan_embeddings, out["resumed"], "--use_ema", "--resume_from_checkpoint", "latest"))
    _run(_argv(tiny_wan_a14b_dir, wan_embeddings, out["high"], "--train_experts", "high", "--fsdp_version", "2"))
    _run(_argv(tiny_wan_a14b_dir, wan_embeddings, out["low"], "--train_experts", "low"))
    _run(_argv(tiny_wan_a14b_dir, wan_embeddings, out["lora"], "--use_lora", "--lora_rank", "4", "--lora_alpha", "8",
                "--train_experts", "low"))
    return out


def _base(folder) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v for name in ("transformer", "transformer_2")
            for k, v in load_file(str(next((folder / name).glob("*.safetensors")))).items()}


def _moved(final, base, expert) -> list[bool]:
    return [not torch.equal(final[k], v) for k, v in base.items() if k.startswith(expert + ".")]


@pytest.mark.slow
def test_each_train_experts_choice_trains_its_experts_only(tiny_wan_a14b_dir, runs):
    base = _base(tiny_wan_a14b_dir)
    for run, trained in (("both", ("transformer", "transformer_2")), ("high", ("transformer",)),
                         ("low", ("transformer_2",))):
        final = load_file(str(runs[run] / "checkpoint-2" / WEIGHTS))
        assert final.keys() == base.keys(), run  # both experts saved, under their folder names
        for expert in ("transformer", "transformer_2"):
            moved = _moved(final, base, expert)
            if expert in trained:
                assert sum(moved) > len(moved) // 2, (run, expert)  # the trained expert's weights move
            else:
                assert not any(moved), (run, expert)  # the frozen one's are bit-unchanged
        rows = read_metrics(runs[run])
        assert [r["iteration"] for r in rows] == [1, 2] and rows[0]["grad_norm"] > 0
    ema = load_file(str(runs["both"] / "checkpoint-2" / "ema.safetensors"))
    assert {k.split(".")[0] for k in ema} == {"transformer", "transformer_2"}


@pytest.mark.slow
def test_two_experts_resume_exactly_and_export_a_pipeline_folder(tiny_wan_a14b_dir, runs, tmp_path):
    from diffusers import WanPipeline

    from fastvideo.training.export import export_checkpoint

    rows, again = read_metrics(runs["both"]), read_metrics(runs["resumed"])
    for key in ("reward_mean", "loss", "grad_norm"):
        assert rows[1][key] == again[1][key], key
    final = load_file(str(runs["both"] / "checkpoint-2" / WEIGHTS))
    again_final = load_file(str(runs["resumed"] / "checkpoint-2" / WEIGHTS))
    assert final.keys() == again_final.keys() and all(torch.equal(final[k], again_final[k]) for k in final)
    out = export_checkpoint(runs["both"] / "checkpoint-2", tmp_path / "exported", base=tiny_wan_a14b_dir)
    pipe, stock = WanPipeline.from_pretrained(out), WanPipeline.from_pretrained(tiny_wan_a14b_dir)
    assert pipe.config.boundary_ratio == 0.875 and type(pipe.transformer_2).__name__ == "WanTransformer3DModel"
    for name in ("transformer", "transformer_2"):
        state = getattr(pipe, name).state_dict()
        assert all(torch.equal(state[k], final[f"{name}.{k}"]) for k in state), name
    samples = []
    for p in (pipe, stock):
        p.set_progress_bar_config(disable=True)
        latents = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
        samples.append(p(prompt="a red fox", negative_prompt="", guidance_scale=4.0, guidance_scale_2=3.0, height=32,
                         width=32, num_frames=FRAMES, num_inference_steps=2, latents=latents,
                         max_sequence_length=SEQ, output_type="latent").frames)
    assert not torch.allclose(samples[0], samples[1], atol=1e-6)


@pytest.mark.slow
def test_two_expert_lora_exports_load_in_stock_wan_pipeline(tiny_wan_a14b_dir, runs, tmp_path):
    """LoRA on the low-noise expert only (--train_experts low): --lora writes that expert's diffusers
    file alone, which stock WanPipeline.load_lora_weights(..., load_into_transformer_2=True) loads and
    fuses; --merge writes transformer/ (the base's, bit for bit) and transformer_2/ (merged). The
    two exports agree bit for bit."""
    from diffusers import WanPipeline

    from fastvideo.training.export import LORA_PART_FILES, export_lora, export_merged, lora_load_lines

    ckpt = runs["lora"] / "checkpoint-2"
    lora_out, merged_out = export_lora(ckpt, tmp_path / "lora"), export_merged(ckpt, tmp_path / "merged")
    assert [p.name for p in lora_out.glob("*.safetensors")] == [LORA_PART_FILES["transformer_2"]]
    assert lora_load_lines(lora_out) == [f"pipe.load_lora_weights({str(lora_out)!r}, weight_name="
                                         f"{LORA_PART_FILES['transformer_2']!r}, load_into_transformer_2=True)"]
    pipe = WanPipeline.from_pretrained(tiny_wan_a14b_dir)
    pipe.load_lora_weights(str(lora_out), weight_name=LORA_PART_FILES["transformer_2"], load_into_transformer_2=True)
    pipe.fuse_lora(components=["transformer_2"], lora_scale=1.0)
    pipe.unload_lora_weights()
    base = _base(tiny_wan_a14b_dir)
    for part in ("transformer", "transformer_2"):
        stock, mine = getattr(pipe, part).state_dict(), load_file(str(merged_out / part / WEIGHTS_FILE))
        assert stock.keys() == mine.keys() and all(torch.equal(stock[k], mine[k]) for k in mine), part
        moved = sum(not torch.equal(mine[k], base[f"{part}.{k}"]) for k in mine)
        assert moved >= 8 if part == "transformer_2" else moved == 0, part  # the adapters' Linears only


def test_expert_flags_for_a_one_expert_folder_are_one_line(tiny_wan_dir):
    from fastvideo.errors import UserError
    from fastvideo.models.wan.family import WanFamily
    from fastvideo.models.wan.settings import WanSettings

    for settings, flag in ((WanSettings(num_frames=5, train_experts="low"), "--train_experts low"),
                           (WanSettings(num_frames=5, guidance_scale_2=3.0), "--guidance_scale_2 3.0")):
        with pytest.raises(UserError) as exc:
            WanFamily(settings=settings).check_folder(tiny_wan_dir)
        assert str(exc.value).startswith(flag) and "\n" not in str(exc.value) and "drop the flag" in str(exc.value)
    WanFamily(settings=WanSettings(num_frames=5)).check_folder(tiny_wan_dir)  # the default stands


@pytest.mark.parametrize("script", sorted(WAN_A14B_LAUNCHERS))
def test_a14b_launchers_parse_to_flow_factorys_configuration(script):
    """Flow-Factory's examples/grpo/full/wan22/t2v.yaml (5f6cda1), sources in scripts/finetune/wan22_a14b_grpo_args.sh:
    the high-noise expert trained under FSDP2, 5 frames at 256^2, 10 steps, one Flow-SDE step in 1..2 at 0.9,
    48 prompts x 16 an iteration in 2 optimizer steps, CLIP + 0.5 PickScore."""
    from fastvideo.config import build_parser, validate_args

    world, prompts, accumulation = WAN_A14B_LAUNCHERS[script]
    argv = launcher_argv(script)
    cfg = validate_args(build_parser(argv).parse_args(argv))
    r, g, m = cfg.rollout, cfg.grpo, cfg.mix
    assert cfg.model.family == "wan" and cfg.plugins["wan"].train_experts == "high" and cfg.fsdp_version == 2
    assert cfg.plugins["wan"].num_frames == 5 and (r.height, r.width, r.sampling_steps) == (256, 256, 10)
    assert (r.eta, r.shift, r.quantize_timestep, r.guidance_scale, r.num_generations) == (0.9, 3.0, False, 5.0, 16)
    assert (m.mode, m.window_size, m.start_strategy, m.window_range) == ("fast", 1, "random", (1, 3))
    assert (g.clip_range, g.adv_clip_max, cfg.optim.learning_rate, cfg.optim.weight_decay) == (1e-4, 5.0, 1e-4, 1e-4)
    assert [(s.name, s.weight) for s in cfg.reward.spec] == [("clip", 1.0), ("pickscore", 0.5)]
    assert cfg.prompts_per_rank == prompts and cfg.prompts_per_rank * world == 48
    assert cfg.update.gradient_accumulation_steps == accumulation
    assert cfg.derived(world)["optimizer_steps_per_iteration"] == 2
