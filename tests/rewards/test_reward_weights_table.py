"""One table of reward weights (fastvideo/rewards/weights.py, issue #52 item 2): the README's "Reward
weights" table is that table; the reward flags' default folders, the launchers' variables
(scripts/common.sh FG_REWARD_DIRS) and the launchers' folders are its; every missing-weights line
(each reward's own check and the launcher's pre-flight) names the folder, the flag, the launcher
variable and quotes the row's source and download command."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fastvideo.rewards import weights

ROOT = Path(__file__).resolve().parents[2]
FLAG_OF = {"hpsv2": "hps_ckpt_dir", "pickscore": "pickscore_dir", "clip": "clip_dir", "aesthetic": "aesthetic_dir",
           "imagereward": "image_reward_dir"}


def test_readme_table_is_the_code_table():
    readme = (ROOT / "README.md").read_text().splitlines()
    table = weights.readme_table()
    start = readme.index(table[0])
    assert readme[start:start + len(table)] == table
    assert readme[start + len(table)].strip() == ""  # no extra row the code does not know
    for old in ("pickscore_ckpt", "clip_ckpt", "aesthetic_ckpt/"):  # one layout: the table's
        assert old not in "\n".join(readme), old


def test_flag_defaults_and_launcher_variables_are_the_tables():
    from fastvideo.rewards.settings import RewardSettings

    parser = argparse.ArgumentParser()
    RewardSettings.add_flags(parser)
    defaults = parser.parse_args([])
    for reward, flag in FLAG_OF.items():
        row = weights.weights_of(reward)[0]
        assert getattr(defaults, flag) == row.folder and row.flag == f"--{flag}", reward
    common = (ROOT / "scripts" / "common.sh").read_text()
    entries = re.search(r"FG_REWARD_DIRS=\((.*?)\)\n", common, re.S).group(1)
    pairs = {e.split()[0]: e.split()[1] for e in re.findall(r'"([^"]+)"', entries)}
    assert pairs == {w.variable: w.flag for w in weights.WEIGHTS}
    # every launcher's folder for a reward is the table's
    for path in (ROOT / "scripts" / "finetune").glob("*.sh"):
        for var, folder in re.findall(r"\$\{(\w+_DIR):-([^}]+)\}", path.read_text()):
            row = next((w for w in weights.WEIGHTS if w.variable == var), None)
            assert row is None or folder == row.folder, (path.name, var, folder)


def _quotes_its_rows(line: str, reward: str, folder: str) -> None:
    rows = weights.weights_of(reward)
    assert folder in line and rows[0].flag in line and f"{rows[0].variable}=" in line, line
    for w in rows:
        assert w.source in line and w.command.replace(w.folder, folder) in line, (w.what, line)
    assert "\n" not in line


def test_every_missing_weights_error_quotes_the_table(tmp_path):
    from fastvideo.rewards.aesthetic import resolve_aesthetic_files
    from fastvideo.rewards.clip_score import MODEL_FILES, check_hf_folder
    from fastvideo.rewards.hps import resolve_hps_files
    from fastvideo.rewards.imagereward import resolve_image_reward_files

    missing = str(tmp_path / "nowhere")
    checks = {"hpsv2": lambda: resolve_hps_files(missing), "aesthetic": lambda: resolve_aesthetic_files(missing),
              "imagereward": lambda: resolve_image_reward_files(missing),
              "pickscore": lambda: check_hf_folder(missing, "PickScore", MODEL_FILES, "pickscore"),
              "clip": lambda: check_hf_folder(missing, "CLIP", MODEL_FILES, "clip"),
              "clip_edit": lambda: check_hf_folder(missing, "CLIP", MODEL_FILES, "clip_edit")}
    for reward, check in checks.items():
        with pytest.raises(OSError) as err:
            check()
        _quotes_its_rows(str(err.value), reward, missing)
    # a folder that exists but lacks a file: the same sentence
    (tmp_path / "half").mkdir()
    with pytest.raises(OSError) as err:
        resolve_hps_files(tmp_path / "half")
    _quotes_its_rows(str(err.value), "hpsv2", str(tmp_path / "half"))


def test_preflight_names_every_local_rewards_weights(tmp_path):
    from fastvideo.preflight import reward_problems
    from fastvideo.rewards.combine import parse_reward_spec
    from fastvideo.rewards.flags import RewardExtras

    d = {name: str(tmp_path / name) for name in FLAG_OF}
    r = SimpleNamespace(spec=parse_reward_spec("hpsv2:1,pickscore:1,clip:1,aesthetic:1,imagereward:1"),
                        hps_ckpt_dir=d["hpsv2"], hps_model_name="ViT-H-14", pickscore_dir=d["pickscore"],
                        clip_dir=d["clip"], extras=RewardExtras(aesthetic_dir=d["aesthetic"],
                                                                image_reward_dir=d["imagereward"]))
    problems = reward_problems(r)
    assert len(problems) == 5, problems
    for reward, line in zip(("hpsv2", "pickscore", "clip", "aesthetic", "imagereward"), problems):
        _quotes_its_rows(line, reward, d[reward])


def test_an_exported_folder_variable_reaches_the_trainer_once():
    """HPS_DIR=DIR becomes --hps_ckpt_dir DIR (the FLUX.1 launchers name no folder); MixGRPO's
    launcher, which names it with --hps_path, gets no second flag."""
    def dry(launcher, **env):
        out = subprocess.run(["bash", f"scripts/finetune/{launcher}"], cwd=ROOT, capture_output=True, text=True,
                             check=True, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "DRY_RUN": "1",
                                              "FASTVIDEO_DEVICE": "cpu", **env}).stdout
        return out.strip().splitlines()[-1].split()

    words = dry("finetune_flux_grpo_8gpus.sh", HPS_DIR="/w/hps", CLIP_DIR="/w/clip")
    assert words[words.index("--hps_ckpt_dir") + 1] == "/w/hps" and words.count("--hps_ckpt_dir") == 1
    assert words[words.index("--clip_dir") + 1] == "/w/clip"
    words = dry("finetune_flux_grpo_8gpus.sh")
    assert "--hps_ckpt_dir" not in words and "--clip_dir" not in words
    words = dry("finetune_flux_mixgrpo_8gpus.sh", HPS_DIR="/w/hps")
    assert "--hps_ckpt_dir" not in words and "/w/hps/HPS_v2.1_compressed.pt" in words
