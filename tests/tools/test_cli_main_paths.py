"""Every `python -m fastvideo.tools.X` command, run through its `__main__` path on tiny inputs, with
assertions on what it prints and writes, so that a line lost in a CLI (a missing return, a dropped
print, a lost `if __name__ == "__main__"`) fails here.

The tools run in-process through runpy (as `python -m` runs them, without a new interpreter per
tool); the reward server, which blocks serving, runs in a subprocess.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import runpy
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fastvideo.tools

ROOT = Path(__file__).resolve().parents[2]

# Each tool with a main() and the test below that runs it.
COVERED = {
    "compare_metrics": "test_compare_metrics_cli",
    "compare_runs": "test_compare_runs_cli",
    "cost_model": "test_cost_model_memory_prints_table_and_verdict",
    "demo_figures": "test_demo_figures_cli",
    "demo_summary": "test_demo_summary_cli",
    "evaluate": "test_evaluate_cli",
    "export": "test_export_cli",
    "launcher_cost": "test_launcher_cost_cli",
    "make_edit_assets": "test_make_edit_assets_cli",
    "make_tiny_flux": "test_make_tiny_flux_cli",
    "make_tiny_kontext": "test_make_tiny_kontext_cli",
    "make_tiny_flux2": "test_make_tiny_flux2_cli",
    "make_tiny_hunyuan_video": "test_make_tiny_hunyuan_video_cli",
    "make_tiny_reward": "test_make_tiny_reward_cli",
    "make_tiny_sd3": "test_make_tiny_sd3_cli",
    "make_tiny_qwen_image": "test_make_tiny_qwen_image_cli",
    "make_tiny_qwen_image_edit": "test_make_tiny_qwen_image_edit_cli",
    "make_tiny_videoalign": "test_make_tiny_videoalign_cli",
    "make_tiny_wan": "test_make_tiny_wan_cli",
    "make_tiny_zimage": "test_make_tiny_zimage_cli",
    "omp_threads": "test_omp_threads_cli",
    "reward_server": "test_reward_server_cli",
}


def run_tool(name: str, argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """`python -m fastvideo.tools.<name> ARGV` in this process: (exit status, stdout)."""
    module = f"fastvideo.tools.{name}"
    monkeypatch.setattr(sys, "argv", [module, *argv])
    monkeypatch.delitem(sys.modules, module, raising=False)  # runpy runs a fresh copy, as -m does
    capsys.readouterr()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, capsys.readouterr().out


def test_every_tool_with_a_main_is_run_here():
    tools = []
    for info in pkgutil.iter_modules(fastvideo.tools.__path__):
        module = importlib.import_module(f"fastvideo.tools.{info.name}")
        if callable(getattr(module, "main", None)):
            tools.append(info.name)
            source = Path(module.__file__).read_text(encoding="utf-8")
            assert 'if __name__ == "__main__":' in source, f"{info.name} has a main() but no __main__ entry"
    assert sorted(tools) == sorted(COVERED), "a tool without a CLI test here (or a test for a removed tool)"
    assert all(callable(globals()[test]) for test in COVERED.values())


def test_demo_figures_cli(tmp_path, monkeypatch, capsys):
    run = tmp_path / "outputs_wan"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"reward_mean": -4.0, "time_iteration": 2.0}\n'
                                       '{"reward_mean": -3.5, "time_iteration": 2.0}\n')
    (run / "config.json").write_text('{"reward": {"spec": ["compressibility:1"]}}')
    out_md = tmp_path / "figures.md"
    code, out = run_tool("demo_figures", ["--out", str(out_md), "--demos", "wan", "--from_runs", str(tmp_path)],
                         monkeypatch, capsys)
    assert code == 0 and "| wan | current | 2 | -4.000 -> -3.500 (+0.500) | - | 4 |" in out
    assert out_md.read_text() == out
    assert run_tool("demo_figures", ["--out", str(out_md), "--demos", "nope"], monkeypatch, capsys)[0] == 2


def test_demo_summary_cli(tmp_path, monkeypatch, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"reward_mean": -4.0, "time_iteration": 2.0}\n'
                                            '{"reward_mean": -3.5, "time_iteration": 2.0}\n')
    (tmp_path / "config.json").write_text('{"reward": {"spec": ["compressibility:1"]}}')
    code, out = run_tool("demo_summary", [str(tmp_path)], monkeypatch, capsys)
    assert code == 0 and out.startswith("demo: reward (minus JPEG kB) first 1 iterations -4.000 -> last 1 "
                                        "iterations -3.500 (rose); 2 iterations, 4 s\n")
    assert run_tool("demo_summary", [], monkeypatch, capsys)[0] == 2


def test_compare_metrics_cli(tmp_path, monkeypatch, capsys):
    row = {"iteration": 1, "reward_mean": -3.83, "loss": 0.0017, "grad_norm": 0.0235, "time_iteration": 1.0}
    for name, value in (("a", 0.0235), ("b", 0.0235), ("c", 0.02350000000000001)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps({**row, "grad_norm": value}) + "\n")
    code, out = run_tool("compare_metrics", [str(tmp_path / "a"), str(tmp_path / "b")], monkeypatch, capsys)
    assert code == 0 and "IDENTICAL: 1 iterations" in out and "-3.83 =" in out
    code, out = run_tool("compare_metrics", [str(tmp_path / "a"), str(tmp_path / "c")], monkeypatch, capsys)
    assert code == 1 and "DIFFERENT: metrics.jsonl: iteration 1 (line 1), key 'grad_norm'" in out


def test_compare_runs_cli(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "tests" / "alignment"))
    try:
        from alignment_helpers import record_run
    finally:
        sys.path.remove(str(ROOT / "tests" / "alignment"))
    ref, twin = record_run(tmp_path / "ref", iterations=2), record_run(tmp_path / "twin", iterations=2)
    off = record_run(tmp_path / "off", iterations=2, reward_factor=lambda it: 1.10 if it >= 2 else 1.0)
    code, out = run_tool("compare_runs", [str(ref), str(twin), "--out", str(tmp_path / "same")], monkeypatch, capsys)
    assert code == 0 and out.startswith("PASS: report in ") and "reward: PASS" in out
    assert "## Verdict: **PASS**" in (tmp_path / "same" / "report.md").read_text()
    code, out = run_tool("compare_runs", [str(ref), str(off), "--out", str(tmp_path / "off_out")], monkeypatch, capsys)
    assert code == 1 and out.startswith("FAIL: ") and "reward: FAIL" in out


def test_cost_model_memory_prints_table_and_verdict(monkeypatch, capsys):
    """`cost_model --memory --device_memory_gb 64` printed `None` once (a merge lost the return)."""
    code, out = run_tool("cost_model", ["--memory", "--device_memory_gb", "64"], monkeypatch, capsys)
    assert code == 0 and "None" not in out
    lines = out.splitlines()
    assert lines[0].startswith("model FLUX.1-dev: 720x720, 12 samples per rank, 16 ranks, full sharding")
    table = {line.split()[0]: float(line.split()[-1]) for line in lines if line[:1].isalpha() and
             len(line.split()) == 2 and line.split()[-1].replace(".", "").isdigit()}
    assert {"parameters", "gradients", "adamw_states", "activations"} <= set(table)
    peak = next(line for line in lines if line.startswith("peak ("))
    peak_gb = float(peak.split()[-1])
    assert peak_gb > table["parameters"] > 0
    verdict = next(line for line in lines if "64 GB" in line)
    assert verdict.startswith("fits in 64 GB, with " if peak_gb <= 64 else "does not fit in 64 GB, by ")
    assert float(verdict.split()[-4 if peak_gb <= 64 else -2]) == pytest.approx(abs(64 - peak_gb), abs=0.06)
    # --json carries the verdict too
    code, out = run_tool("cost_model", ["--memory", "--json", "--model", "tiny", "--device_memory_gb", "64"],
                         monkeypatch, capsys)
    record = json.loads(out)
    assert code == 0 and record["verdict"].startswith("fits in 64 GB") and record["peak_bytes"] > 0
    # the FLOPs table (the default path)
    code, out = run_tool("cost_model", ["--model", "tiny", "--world_size", "2"], monkeypatch, capsys)
    assert code == 0 and "None" not in out and "rollout" in out


def test_launcher_cost_cli(monkeypatch, capsys):
    """`launcher_cost LAUNCHER`: a header and one row per launcher; the A3 launcher's row is its 16
    ranks, bf16 gathers, the gathered rollout with 9 timesteps per forward, 1092 GB against 16565 GB
    (15.2x) and the 64 GB verdict."""
    for name in ("LEAN", "SP", "EXTRA_ARGS", "NPROC", "REWARDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHON", sys.executable)
    code, out = run_tool("launcher_cost", ["scripts/finetune/finetune_flux_grpo_a3_16die.sh",
                                           "--device_memory_gb", "64"], monkeypatch, capsys)
    header, row = out.splitlines()
    assert code == 0 and header.split()[:2] == ["launcher", "W"]
    words = row.split()
    assert words[:5] == ["finetune_flux_grpo_a3_16die.sh", "16", "bf16", "gathered", "9"]
    assert (words[5], words[6], words[7]) == ("1092", "16565", "15.2x")
    assert "fits in 64 GB" in row


def test_evaluate_cli(tiny_flux_dir, tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cube\na calm lake\n", encoding="utf-8")
    argv = ["--model", f"base={tiny_flux_dir}", "--prompts", str(prompts), "--rewards", "compressibility,detail",
            "--out", str(tmp_path / "eval"), "--h", "32", "--w", "32", "--steps", "2", "--seed", "7",
            "--num_images_per_prompt", "2", "--batch_size", "4", "--max_sequence_length", "32"]
    code, out = run_tool("evaluate", argv, monkeypatch, capsys)
    assert code == 0
    assert "| model | reward | mean | std | 95% CI | win rate vs base | n |" in out
    assert "| base | detail |" in out and f"[evaluate] wrote {tmp_path / 'eval'}/results.md" in out
    scores = [json.loads(line) for line in (tmp_path / "eval" / "scores.jsonl").read_text().splitlines()]
    assert len(scores) == 2 * 2  # prompts x images, every reward in each row
    assert all(set(r["scores"]) == {"compressibility", "detail"} for r in scores)
    table = [line for line in (tmp_path / "eval" / "results.md").read_text().splitlines() if line.startswith("|")]
    assert len(table) == 4 and table == [line for line in out.splitlines() if line.startswith("|")]
    detail = [r["scores"]["detail"] for r in scores]
    assert float(table[3].split("|")[3]) == pytest.approx(sum(detail) / len(detail), rel=1e-3)


def test_export_cli(tiny_flux_dir, tmp_path, monkeypatch, capsys):
    from fastvideo.models import flux
    from fastvideo.training.checkpoint import Checkpointer

    model = flux.load_transformer(tiny_flux_dir)
    ckpt = Checkpointer(tmp_path / "run").save(3, model=model, transformer_config=dict(model.config))
    out_dir = tmp_path / "exported"
    code, out = run_tool("export", [str(ckpt), str(out_dir)], monkeypatch, capsys)
    assert code == 0
    assert out.strip() == f"exported policy weights of {ckpt} as a diffusers transformer folder: {out_dir}"
    saved, exported = load_file(ckpt / "diffusion_pytorch_model.safetensors"), load_file(out_dir / "diffusion_pytorch_model.safetensors")
    assert saved.keys() == exported.keys() and all(torch.equal(saved[k], exported[k]) for k in saved)
    assert json.loads((out_dir / "config.json").read_text())["_class_name"] == "FluxTransformer2DModel"
    # a LoRA export of a full checkpoint is refused with the fix, exit status non-zero
    code, _ = run_tool("export", [str(ckpt), str(tmp_path / "x"), "--lora"], monkeypatch, capsys)
    assert code != 0 and not (tmp_path / "x").exists()


def test_make_tiny_flux_cli(tiny_flux_dir, tmp_path, monkeypatch, capsys):
    code, out = run_tool("make_tiny_flux", [str(tmp_path / "flux"), "--preset", "tiny", "--seed", "0"],
                         monkeypatch, capsys)
    assert code == 0 and out.startswith(f"wrote tiny FLUX folder to {tmp_path / 'flux'} (") and "seed 0" in out
    name = "transformer/diffusion_pytorch_model.safetensors"
    mine, fixture = load_file(tmp_path / "flux" / name), load_file(Path(tiny_flux_dir) / name)
    assert mine.keys() == fixture.keys() and all(torch.equal(mine[k], fixture[k]) for k in mine)  # same seed


def test_make_tiny_sd3_cli(tiny_sd3_dir, tmp_path, monkeypatch, capsys):
    code, out = run_tool("make_tiny_sd3", [str(tmp_path / "sd3"), "--seed", "0"], monkeypatch, capsys)
    assert code == 0 and out.startswith(f"wrote tiny SD3.5 folder to {tmp_path / 'sd3'} (") and "seed 0" in out
    index = json.loads((tmp_path / "sd3" / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusion3Pipeline"
    name = "transformer/diffusion_pytorch_model.safetensors"
    mine, fixture = load_file(tmp_path / "sd3" / name), load_file(Path(tiny_sd3_dir) / name)
    assert mine.keys() == fixture.keys() and all(torch.equal(mine[k], fixture[k]) for k in mine)  # same seed


def test_make_tiny_hunyuan_video_cli(tiny_hunyuan_video_dir, tmp_path, monkeypatch, capsys):
    """Both lines: the tiny HunyuanVideo folder, the fixture's weights bit for bit from the same seed."""
    code, out = run_tool("make_tiny_hunyuan_video", [str(tmp_path / "hv"), "--seed", "0"], monkeypatch, capsys)
    assert code == 0 and out.startswith(f"wrote tiny HunyuanVideo folder to {tmp_path / 'hv'} (") and "seed 0" in out
    for name in ("transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors"):
        mine, fixture = load_file(tmp_path / "hv" / name), load_file(Path(tiny_hunyuan_video_dir) / name)
        assert mine.keys() == fixture.keys() and all(torch.equal(mine[k], fixture[k]) for k in mine)  # same seed


def test_make_tiny_flux2_cli(tmp_path, monkeypatch, capsys):
    """The current line: the tiny klein, the same weights bit for bit from the same seed, --distilled
    marks model_index.json; the recipe line: exit 2, nothing written (the line is named on stderr)."""
    from fastvideo.library_lines import CURRENT, library_line

    code, out = run_tool("make_tiny_flux2", [str(tmp_path / "f2"), "--seed", "0", "--distilled"], monkeypatch, capsys)
    if library_line() != CURRENT:
        assert code == 2 and not (tmp_path / "f2").exists()
        return
    assert code == 0 and out.startswith(f"wrote tiny FLUX.2 [klein] folder to {tmp_path / 'f2'} (") and "distilled" in out
    assert json.loads((tmp_path / "f2" / "model_index.json").read_text())["is_distilled"] is True
    from fastvideo.tools.make_tiny_flux2 import make_tiny_flux2

    name = "transformer/diffusion_pytorch_model.safetensors"
    mine, again = load_file(tmp_path / "f2" / name), load_file(make_tiny_flux2(tmp_path / "again", seed=0) / name)
    assert mine.keys() == again.keys() and all(torch.equal(mine[k], again[k]) for k in mine)  # same seed


def test_make_tiny_wan_cli(tmp_path, monkeypatch, capsys):
    """The current line: a tiny Wan2.2-TI2V folder (--variant ti2v: expand_timesteps, the 48-channel
    VAE), the same weights bit for bit from the same seed; the recipe line: exit 2, nothing written."""
    from fastvideo.library_lines import CURRENT, library_line

    code, out = run_tool("make_tiny_wan", [str(tmp_path / "w"), "--seed", "0", "--variant", "ti2v"], monkeypatch, capsys)
    if library_line() != CURRENT:
        assert code == 2 and not (tmp_path / "w").exists()
        return
    assert code == 0 and out.startswith(f"wrote tiny Wan ti2v folder to {tmp_path / 'w'} (") and "seed 0" in out
    assert json.loads((tmp_path / "w" / "model_index.json").read_text())["expand_timesteps"] is True
    assert json.loads((tmp_path / "w" / "vae" / "config.json").read_text())["z_dim"] == 48
    from fastvideo.tools.make_tiny_wan import make_tiny_wan

    name = "transformer/diffusion_pytorch_model.safetensors"
    mine, again = load_file(tmp_path / "w" / name), load_file(make_tiny_wan(tmp_path / "again", 0, "ti2v") / name)
    assert mine.keys() == again.keys() and all(torch.equal(mine[k], again[k]) for k in mine)  # same seed


def test_make_tiny_videoalign_cli(tmp_path, monkeypatch, capsys):
    """Both lines: a tiny VideoAlign folder in the released layout (model_config.json, checkpoint-1,
    the base model); --lora writes PEFT's adapter files instead of model.pth; the same seed gives the
    same checkpoint bit for bit; a bad option value exits 2."""
    code, out = run_tool("make_tiny_videoalign", [str(tmp_path / "v"), "--seed", "0"], monkeypatch, capsys)
    assert code == 0 and out.startswith(f"wrote tiny VideoAlign folder to {tmp_path / 'v'} (") and "seed 0" in out
    config = json.loads((tmp_path / "v" / "model_config.json").read_text())
    assert config["model_config"]["output_dim"] == 3 and config["peft_lora_config"] == {"lora_enable": False}
    assert (tmp_path / "v" / "Qwen2-VL-2B-Instruct" / "config.json").is_file()
    mine = torch.load(tmp_path / "v" / "checkpoint-1" / "model.pth", weights_only=True)
    from fastvideo.tools.make_tiny_videoalign import make_tiny_videoalign

    again = torch.load(make_tiny_videoalign(tmp_path / "again", 0) / "checkpoint-1" / "model.pth", weights_only=True)
    assert mine.keys() == again.keys() and "rm_head.weight" in mine
    assert all(torch.equal(mine[k], again[k]) for k in mine)  # same seed
    code, out = run_tool("make_tiny_videoalign", [str(tmp_path / "l"), "--seed", "1", "--lora"], monkeypatch, capsys)
    assert code == 0 and "tiny VideoAlign (LoRA)" in out
    assert sorted(p.name for p in (tmp_path / "l" / "checkpoint-1").iterdir()) == [
        "adapter_model.safetensors", "non_lora_state_dict.pth"]
    assert run_tool("make_tiny_videoalign", [str(tmp_path / "x"), "--seed", "one"], monkeypatch, capsys)[0] == 2


def test_make_tiny_zimage_cli(tmp_path, monkeypatch, capsys):
    """The current line: a tiny Z-Image folder, the same weights bit for bit from the same seed; the
    recipe line: exit 2, nothing written."""
    from fastvideo.library_lines import CURRENT, library_line

    code, out = run_tool("make_tiny_zimage", [str(tmp_path / "z"), "--seed", "0"], monkeypatch, capsys)
    if library_line() != CURRENT:
        assert code == 2 and not (tmp_path / "z").exists()
        return
    assert code == 0 and str(tmp_path / "z") in out
    assert json.loads((tmp_path / "z" / "model_index.json").read_text())["_class_name"] == "ZImagePipeline"
    from fastvideo.tools.make_tiny_zimage import make_tiny_zimage

    name = "transformer/diffusion_pytorch_model.safetensors"
    mine, again = load_file(tmp_path / "z" / name), load_file(make_tiny_zimage(tmp_path / "again", seed=0) / name)
    assert mine.keys() == again.keys() and all(torch.equal(mine[k], again[k]) for k in mine)


def test_make_tiny_qwen_image_cli(tmp_path, monkeypatch, capsys):
    """The current line: a tiny Qwen-Image folder, the same weights bit for bit from the same seed; the
    recipe line: exit 2, nothing written."""
    from fastvideo.library_lines import CURRENT, library_line

    code, out = run_tool("make_tiny_qwen_image", [str(tmp_path / "q"), "--seed", "0"], monkeypatch, capsys)
    if library_line() != CURRENT:
        assert code == 2 and not (tmp_path / "q").exists()
        return
    assert code == 0 and str(tmp_path / "q") in out
    assert json.loads((tmp_path / "q" / "model_index.json").read_text())["_class_name"] == "QwenImagePipeline"
    from fastvideo.tools.make_tiny_qwen_image import make_tiny_qwen_image

    name = "transformer/diffusion_pytorch_model.safetensors"
    mine, again = load_file(tmp_path / "q" / name), load_file(make_tiny_qwen_image(tmp_path / "again", seed=0) / name)
    assert mine.keys() == again.keys() and all(torch.equal(mine[k], again[k]) for k in mine)


def test_make_edit_assets_cli(tmp_path, monkeypatch, capsys):
    """Seed 0 at 64 px writes the repository's assets/edit byte for byte; a size that is not a multiple
    of 16 is refused (exit 2) with nothing written."""
    code, out = run_tool("make_edit_assets", [str(tmp_path / "e")], monkeypatch, capsys)
    assert code == 0 and str(tmp_path / "e") in out
    kept = sorted(p.relative_to(ROOT / "assets" / "edit") for p in (ROOT / "assets" / "edit").rglob("*") if p.is_file())
    made = sorted(p.relative_to(tmp_path / "e") for p in (tmp_path / "e").rglob("*") if p.is_file())
    assert made == kept and len(made) == 14
    assert all((tmp_path / "e" / p).read_bytes() == (ROOT / "assets" / "edit" / p).read_bytes() for p in made)
    code, _ = run_tool("make_edit_assets", [str(tmp_path / "bad"), "--size", "40"], monkeypatch, capsys)
    assert code == 2 and not (tmp_path / "bad").exists()


def test_make_tiny_kontext_cli(tmp_path, monkeypatch, capsys):
    """A FLUX.1 folder whose index names FluxKontextPipeline; the same weights from the same seed."""
    code, out = run_tool("make_tiny_kontext", [str(tmp_path / "k"), "--seed", "3"], monkeypatch, capsys)
    assert code == 0 and str(tmp_path / "k") in out
    assert json.loads((tmp_path / "k" / "model_index.json").read_text())["_class_name"] == "FluxKontextPipeline"
    from fastvideo.tools.make_tiny_kontext import make_tiny_kontext

    name = "transformer/diffusion_pytorch_model.safetensors"
    mine, again = load_file(tmp_path / "k" / name), load_file(make_tiny_kontext(tmp_path / "again", seed=3) / name)
    other = load_file(make_tiny_kontext(tmp_path / "other", seed=4) / name)
    assert mine.keys() == again.keys() and all(torch.equal(mine[k], again[k]) for k in mine)
    assert not all(torch.equal(mine[k], other[k]) for k in mine)


def test_make_tiny_qwen_image_edit_cli(tmp_path, monkeypatch, capsys):
    """The current line: a tiny Qwen-Image-Edit folder (with its processor), the same weights bit for bit
    from the same seed; the recipe line: exit 2, nothing written."""
    from fastvideo.library_lines import CURRENT, library_line

    code, out = run_tool("make_tiny_qwen_image_edit", [str(tmp_path / "q"), "--seed", "0"], monkeypatch, capsys)
    if library_line() != CURRENT:
        assert code == 2 and not (tmp_path / "q").exists()
        return
    assert code == 0 and str(tmp_path / "q") in out
    index = json.loads((tmp_path / "q" / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImageEditPlusPipeline" and "processor" in index
    from fastvideo.tools.make_tiny_qwen_image_edit import make_tiny_qwen_image_edit

    name = "text_encoder/model.safetensors"
    mine, again = load_file(tmp_path / "q" / name), load_file(make_tiny_qwen_image_edit(tmp_path / "again", seed=0) / name)
    assert any("visual" in k for k in mine)  # the VL encoder has its vision tower
    assert mine.keys() == again.keys() and all(torch.equal(mine[k], again[k]) for k in mine)


def test_make_tiny_reward_cli(tmp_path, monkeypatch, capsys):
    code, out = run_tool("make_tiny_reward", [str(tmp_path / "rewards"), "--seed", "1"], monkeypatch, capsys)
    assert code == 0
    printed = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    assert set(printed) == {"HPS", "PickScore", "Aesthetic", "ImageReward"}
    for value in printed.values():
        assert Path(value.split(" (")[0].strip()).is_dir()
    assert (tmp_path / "rewards" / "hps_ckpt" / "HPS_v2.1_compressed.pt").is_file()


def test_reward_server_cli(tmp_path):
    from server_utils import free_port

    from fastvideo.rewards.registry import build_reward
    from fastvideo.rewards.remote import RemoteReward

    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               FASTVIDEO_DEVICE="cpu")
    cmd = [sys.executable, "-m", "fastvideo.tools.reward_server", "--rewards", "compressibility", "--device", "cpu",
           "--host", "127.0.0.1", "--port", str(port), "--token", "s3cret"]
    auth = {"Authorization": "Bearer s3cret"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"reward server exited: {proc.stdout.read()}"
            assert time.monotonic() < deadline, "reward server did not come up in 60 s"
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/health", headers=auth)
                health = json.loads(urllib.request.urlopen(request, timeout=2).read())
                break
            except OSError:
                time.sleep(0.2)
        assert "compressibility" in health["rewards"]
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        prompts = ["a", "b", "c"]
        remote = RemoteReward(f"http://127.0.0.1:{port}/compressibility?token=s3cret")(images, prompts)
        assert torch.equal(remote, build_reward("compressibility")(images, prompts).float())
    finally:
        proc.terminate()
        printed, _ = proc.communicate(timeout=30)
    assert f"[reward_server] serving compressibility on cpu at http://127.0.0.1:{port} (token required)" in printed
    assert "GET /health 401" in printed and "POST /score/compressibility 200" in printed  # one line per request
    assert "Traceback" not in printed


def test_omp_threads_cli(monkeypatch, capsys):
    from fastvideo.tools.omp_threads import threads_per_process

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    code, out = run_tool("omp_threads", ["2"], monkeypatch, capsys)
    assert code == 0 and int(out) == threads_per_process(2)
