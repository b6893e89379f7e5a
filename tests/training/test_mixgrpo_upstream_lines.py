"""MixGRPO's own three launch lines (Tencent-Hunyuan/MixGRPO scripts/finetune/
finetune_flux_grpo_MixGRPO{,_Flash,_Flash*}.sh), read from the upstream mirror with their model and
data paths changed and nothing else: they parse into MixGRPO's settings (multi_reward without a
judge, the window, the DPM tail), and MixGRPO's own line trains 2 iterations on 2 gloo ranks with
tiny HPS, ImageReward and PickScore."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from helpers import read_metrics, torchrun

MIRROR = Path("/work/.mirror/Tencent-Hunyuan+MixGRPO/repo")
SCRIPTS = ("finetune_flux_grpo_MixGRPO.sh", "finetune_flux_grpo_MixGRPO_Flash.sh", "finetune_flux_grpo_MixGRPO_Flash*.sh")
pytestmark = pytest.mark.skipif(not MIRROR.is_dir(), reason="upstream MixGRPO mirror not available")


def upstream_argv(script: str, paths: dict[str, str]) -> list[str]:
    """The flags of the script's torchrun line, its shell variables expanded (an empty variable stays
    one empty word, the value a user fills in, e.g. wandb_key), the variables in ``paths`` replaced."""
    src = subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:scripts/finetune/{script}"],
                         capture_output=True, text=True, check=True).stdout
    values = {}
    for name, raw in re.findall(r"^(\w+)=(.*)$", src, flags=re.M):
        raw = raw.split(" #")[0].strip()
        values[name] = raw[1:-1] if raw[:1] == raw[-1:] == '"' else raw
    values.update(paths)
    line = src.split("fastvideo/train_grpo_flux.py", 1)[1].split('"', 1)[0].replace("\\\n", " ")
    return [values[w[1:]] if w.startswith("$") else w for w in line.split()]


def _paths(tmp, model="m", hps="hps_ckpt", image_reward="ir", data="d.json"):
    return {"model_path": str(model), "hps_path": f"{hps}/HPS_v2.1_compressed.pt",
            "hps_clip_path": f"{hps}/open_clip_pytorch_model.bin", "image_reward_path": f"{image_reward}/ImageReward.pt",
            "image_reward_med_config": f"{image_reward}/med_config.json", "data_json_path": str(data)}


@pytest.mark.parametrize("script", SCRIPTS)
def test_mixgrpo_scripts_parse_into_mixgrpos_settings(script, tmp_path):
    from fastvideo.config import build_parser, validate_args

    argv = upstream_argv(script, _paths(tmp_path))
    assert "--unified_reward_url" in argv and argv[argv.index("--unified_reward_url") + 1] == "None"
    cfg = validate_args(build_parser().parse_args(argv))
    assert [s.name for s in cfg.reward.spec] == ["hpsv2", "imagereward", "pickscore"]  # None: no judge
    assert [s.weight for s in cfg.reward.spec] == pytest.approx([1 / 3] * 3)
    assert cfg.reward.extras.multi_reward_mix == "advantage_aggr"
    assert cfg.mix.mode == "window" and cfg.mix.window_size == 4 and cfg.mix.sde_kind == "flow"
    flash = script != SCRIPTS[0]
    assert cfg.mix.iters_per_group == (20 if flash else 25)
    assert cfg.mix.dpm_post_ratio == {SCRIPTS[0]: None, SCRIPTS[1]: 0.4, SCRIPTS[2]: 0.2}[script]
    assert cfg.mix.move_step == (0 if script == SCRIPTS[2] else 1)
    assert cfg.grpo.rollout_kl_coef == 0.0 and cfg.grpo.trimmed_ratio == 0.0  # the scripts' kl_coeff / trimmed_ratio
    assert cfg.rollout.init_same_noise and cfg.rollout.same_noise_scope == "rank"
    assert cfg.optim.seed == 714 and cfg.optim.sampler_seed == 7144


@pytest.mark.slow
def test_mixgrpo_line_trains_two_iterations_on_two_ranks(tiny_flux_dir, tiny_embeddings, tiny_rewards, tmp_path):
    out = tmp_path / "run"
    argv = upstream_argv(SCRIPTS[0], _paths(tmp_path, tiny_flux_dir, tiny_rewards.hps_ckpt_dir,
                                            tiny_rewards.image_reward_dir, tiny_embeddings))
    argv = [w if w != "data/outputs" else str(out) for w in argv]
    # the CPU-sized run: tiny images, 2 iterations, the tiny HPS architecture and PickScore folder
    argv += ["--h", "32", "--w", "32", "--max_train_steps", "2", "--dataloader_num_workers", "0",
             "--save_images_every", "0", "--hps_model_name", tiny_rewards.hps_model_name,
             "--pickscore_dir", str(tiny_rewards.pickscore_dir)]
    proc = torchrun(argv, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(r["loss"] == r["loss"] and r["grad_norm"] == r["grad_norm"] for r in rows)
    assert {"reward_hpsv2", "reward_imagereward", "reward_pickscore"} <= set(rows[0]) or any(
        "imagereward" in k for k in rows[0]), sorted(rows[0])
