"""Upstream's six FLUX launch lines, paths changed and nothing else: DanceGRPO 15cc71d
scripts/finetune/finetune_flux_grpo{,_8gpus,_8gpus_lora}.sh and MixGRPO e5cdd6a
scripts/finetune/finetune_flux_grpo_MixGRPO{,_Flash,_Flash*}.sh.

The lines' flags are kept in upstream_launch_lines.json (each script's torchrun line, its shell
variables expanded; an empty variable stays one empty word, the value a user fills in, e.g.
wandb_key), so the tests run without the upstream repositories; where their mirrors are present a
test holds the file to the scripts. The lines parse into upstream's settings, and all six train 2
iterations on 2 gloo ranks on the tiny model, in one torchrun start-up (launch_lines_worker.py).

What the CPU-sized runs change besides paths (appended, so the line's own value is overridden):
--h/--w 32 (720 upstream), --max_train_steps 2, --dataloader_num_workers 0, --save_images_every 0,
the tiny reward models' architecture (--hps_model_name; MixGRPO: --pickscore_dir, which its
scripts leave at the hub name), and --rollout_batch_size 24: a rank's whole rollout in one
transformer call instead of one sample per call (trajectories do not depend on it,
sampling/rollout.py; on a tiny model the per-call overhead is the cost). DanceGRPO reads HPS from
./hps_ckpt under the working folder (a path: --hps_ckpt_dir here). Everything else - 12
generations, 12 to 25 sampling steps, one sample per micro-batch, gradient accumulation, gradient
checkpointing, bf16, EMA, LoRA rank 128, MixGRPO's window and DPM tail - is the line's own."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import read_metrics, torchrun
from upstream_repos import upstream_repo

HERE = Path(__file__).resolve().parent
LINES = json.loads((HERE / "upstream_launch_lines.json").read_text())
NAMES = [line["name"] for line in LINES]
BY_NAME = {line["name"]: line for line in LINES}
MIRRORS = {repo: upstream_repo(repo) for repo in ("XueZeyue/DanceGRPO", "Tencent-Hunyuan/MixGRPO")}
# flag -> which of the test's paths replaces upstream's value
PATH_FLAGS = {"--pretrained_model_name_or_path": "model", "--vae_model_path": "model", "--data_json_path": "data",
              "--output_dir": "out", "--cache_dir": "cache", "--hps_path": "hps", "--hps_clip_path": "hps_clip",
              "--image_reward_path": "image_reward", "--image_reward_med_config": "image_reward_med"}


def script_line(repo: str, commit: str, path: str) -> tuple[str, list[str]]:
    """(entry point, flags) of the torchrun line of ``path`` at ``commit`` in the mirror of ``repo``."""
    src = subprocess.run(["git", "-C", str(MIRRORS[repo]), "show", f"{commit}:{path}"],
                         capture_output=True, text=True, check=True).stdout
    values = {}
    for name, raw in re.findall(r"^(\w+)=(.*)$", src, flags=re.M):
        raw = raw.split(" #")[0].strip()
        values[name] = raw[1:-1] if raw[:1] == raw[-1:] == '"' else raw
    entry = re.search(r"fastvideo/(train_grpo_flux(?:_lora)?\.py)", src).group(1)
    tail = src.split(f"fastvideo/{entry}", 1)[1].split('"', 1)[0].replace("\\\n", " ")
    words = [w for w in tail.split() if w != "\\"]
    return entry, [values[w[1:]] if w.startswith("$") else w for w in words]


@pytest.mark.parametrize("name", NAMES)
def test_the_kept_lines_are_upstreams(name):
    line = BY_NAME[name]
    if not MIRRORS[line["repo"]].is_dir():
        pytest.skip(f"upstream {line['repo']} mirror not available")
    assert script_line(line["repo"], line["commit"], line["path"]) == (line["entry"], line["argv"])


def with_paths(argv: list[str], paths: dict[str, str]) -> list[str]:
    """``argv`` with the value after each flag of PATH_FLAGS replaced by its path."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word in PATH_FLAGS:
            out[i + 1] = str(paths[PATH_FLAGS[word]])
    return out


def _paths(root, model="m", data="d.json", hps="hps_ckpt", image_reward="ir") -> dict:
    root = Path(root)
    return {"model": model, "data": data, "out": root / "out", "cache": root / ".cache",
            "hps": f"{hps}/HPS_v2.1_compressed.pt", "hps_clip": f"{hps}/open_clip_pytorch_model.bin",
            "image_reward": f"{image_reward}/ImageReward.pt", "image_reward_med": f"{image_reward}/med_config.json"}


def _parse(name, paths):
    from fastvideo.config import build_parser, validate_args

    line = BY_NAME[name]
    lora = ["--use_lora"] if line["entry"] == "train_grpo_flux_lora.py" else []  # what the LoRA entry adds
    return validate_args(build_parser().parse_args(lora + with_paths(line["argv"], paths)))


@pytest.mark.parametrize("name", NAMES[:3])
def test_dancegrpo_lines_parse_into_dancegrpos_settings(name, tmp_path):
    cfg = _parse(name, _paths(tmp_path))
    assert [s.name for s in cfg.reward.spec] == ["hpsv2"] and cfg.reward.hps_input == "uint8"
    assert cfg.rollout.init_same_noise and cfg.rollout.same_noise_scope == "rank"
    assert cfg.rollout.num_generations == 12 and cfg.rollout.eta == 0.3 and cfg.optim.seed == 42
    assert cfg.grpo.clip_range == 1e-4 and cfg.grpo.adv_clip_max == 5.0 and cfg.mix.mode != "window"
    assert cfg.optim.use_ema == (name == "dancegrpo_8gpus") and cfg.optim.ema_decay == 0.995
    assert cfg.lora.enabled == (name == "dancegrpo_8gpus_lora")
    if cfg.lora.enabled:
        assert cfg.lora.rank == 128 and cfg.lora.alpha == 256 and cfg.lora.base_precision == "master"


@pytest.mark.parametrize("name", NAMES[3:])
def test_mixgrpo_lines_parse_into_mixgrpos_settings(name, tmp_path):
    argv = BY_NAME[name]["argv"]
    assert argv[argv.index("--unified_reward_url") + 1] == "None"
    cfg = _parse(name, _paths(tmp_path))
    assert [s.name for s in cfg.reward.spec] == ["hpsv2", "imagereward", "pickscore"]  # None: no judge
    assert [s.weight for s in cfg.reward.spec] == pytest.approx([1 / 3] * 3)
    assert cfg.reward.extras.multi_reward_mix == "advantage_aggr"
    assert cfg.mix.mode == "window" and cfg.mix.window_size == 4 and cfg.mix.sde_kind == "flow"
    flash = name != "mixgrpo"
    assert cfg.mix.iters_per_group == (20 if flash else 25)
    assert cfg.mix.dpm_post_ratio == {"mixgrpo": None, "mixgrpo_flash": 0.4, "mixgrpo_flash_star": 0.2}[name]
    assert cfg.mix.move_step == (0 if name == "mixgrpo_flash_star" else 1)
    assert cfg.grpo.rollout_kl_coef == 0.0 and cfg.grpo.trimmed_ratio == 0.0  # the scripts' kl_coeff / trimmed_ratio
    assert cfg.rollout.init_same_noise and cfg.rollout.same_noise_scope == "rank"
    assert cfg.optim.seed == 714 and cfg.optim.sampler_seed == 7144


CPU_SIZE = ["--h", "32", "--w", "32", "--max_train_steps", "2", "--dataloader_num_workers", "0",
            "--save_images_every", "0", "--rollout_batch_size", "24"]


def cpu_runs(root: Path, model, data, rewards) -> list[dict]:
    """The six lines with the test's paths and the CPU sizes (module docstring), each its own output."""
    runs = []
    for line in LINES:
        paths = _paths(root / line["name"], model, data, rewards.hps_ckpt_dir, rewards.image_reward_dir)
        tiny = ["--hps_model_name", rewards.hps_model_name]
        if line["repo"] == "XueZeyue/DanceGRPO":
            tiny += ["--hps_ckpt_dir", str(rewards.hps_ckpt_dir)]
        else:
            tiny += ["--pickscore_dir", str(rewards.pickscore_dir)]
        runs.append({"name": line["name"], "entry": line["entry"],
                     "argv": with_paths(line["argv"], paths) + CPU_SIZE + tiny})
    return runs


@pytest.mark.slow
def test_six_upstream_lines_train_two_iterations_on_two_ranks(tiny_flux_dir, tiny_embeddings, tiny_rewards, tmp_path):
    runs = cpu_runs(tmp_path, tiny_flux_dir, tiny_embeddings, tiny_rewards)
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    times = tmp_path / "times.json"
    proc = torchrun([str(tmp_path / "runs.json"), str(times)], timeout=1800,
                    script=str(HERE / "launch_lines_worker.py"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    print("wall seconds per line:", times.read_text())
    assert list(json.loads(times.read_text())) == NAMES
    for name in NAMES:
        out = tmp_path / name / "out"
        rows = read_metrics(out)
        assert [r["iteration"] for r in rows] == [1, 2], name
        assert all(r["loss"] == r["loss"] and r["grad_norm"] == r["grad_norm"] for r in rows), name
        config = json.loads((out / "config.json").read_text())
        assert config["lora"]["enabled"] == (name == "dancegrpo_8gpus_lora"), name
        rewards = {"reward/hpsv2_mean"} | ({"reward/imagereward_mean", "reward/pickscore_mean"}
                                           if name.startswith("mixgrpo") else set())
        assert rewards <= set(rows[0]), (name, sorted(rows[0]))
