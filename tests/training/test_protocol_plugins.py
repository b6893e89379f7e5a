"""A new model family and a new algorithm need no edit under fastvideo/.

tests/training/toy_plugins.py defines a toy family (its own velocity model, conditioning, VAE and
text encoder, in a diffusers-layout folder) and a toy objective (advantage-weighted flow matching
with a running baseline as its own state), using only the public protocols; each brings its own
flag and config section. Here they are named by flags as plugins: preprocessing encodes prompts with
the toy text encoder, and the trainer runs 2 iterations on 2 gloo ranks under FSDP, checkpoints,
and resumes exactly (the plugins' flags read back from the run's config.json).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import ROOT, python_path, read_metrics, torchrun, train_args

HERE = Path(__file__).resolve().parent
FAMILY, OBJECTIVE = "toy_plugins:ToyFamily", "toy_plugins:ToyObjective"


def _env():
    return dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                PYTHONPATH=python_path(ROOT, HERE))


def _run(cmd, timeout=300):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _train(argv):
    proc = torchrun(argv)  # forked ranks (tests/fork_launch.py): toy_plugins is on sys.path (toy_run_inputs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.fixture(scope="module")
def toy_run_inputs(tmp_path_factory):
    sys.path.insert(0, str(HERE))
    from toy_plugins import write_toy_model

    root = tmp_path_factory.mktemp("toy")
    model = write_toy_model(root / "model")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(["a red cube", "two small birds", "a quiet lake at dawn", "an old clock tower"]))
    _run([sys.executable, "-m", "fastvideo.data_preprocess.preprocess_embeddings", "--model_family", FAMILY,
          "--model_path", str(model), "--prompt_dir", str(prompts), "--output_dir", str(root / "emb"),
          "--max_sequence_length", "8", "--dataloader_num_workers", "0"])
    return model, root / "emb" / "videos2caption.json"


def _argv(inputs, out, steps, **extra):
    model, index = inputs
    flags = dict(model_family=FAMILY, algorithm=OBJECTIVE, h=16, w=16, sampling_steps=4, num_generations=4,
                 rollout_batch_size=4, train_micro_batch_size=2, learning_rate=3e-3, max_train_steps=steps,
                 checkpointing_steps=1, save_images_every=0, toy_baseline_decay=0.25, toy_decode_gain=1.5)
    return train_args(index, model, out, **{**flags, **extra})


@pytest.mark.slow
def test_toy_family_and_objective_train_and_resume_exactly(toy_run_inputs, tmp_path):
    model, index = toy_run_inputs
    entries = json.loads(index.read_text())
    assert [sorted(e) for e in entries[:1]] == [["caption", "text_path"]]  # the toy family's storage
    straight, split = tmp_path / "straight", tmp_path / "split"
    _train(_argv(toy_run_inputs, straight, 2))
    _train(_argv(toy_run_inputs, split, 1))
    # The resumed run takes every flag, the plugins' own included, from the first run's config.json.
    _train(["--config", str(split / "config.json"), "--max_train_steps", "2", "--resume_from_checkpoint", "latest"])

    rows, resumed = read_metrics(straight), read_metrics(split)
    assert [r["iteration"] for r in rows] == [1, 2]
    for a, b in zip(rows, resumed):
        for key in ("reward_mean", "loss", "grad_norm", "toy_fm_error", "adv_mean"):
            assert a[key] == b[key], (key, a[key], b[key])
    assert rows[1]["optimizer_steps"] == 2  # 4 samples per rank, micro-batches of 2
    assert "ratio_mean" not in rows[0]  # the GRPO objective's metrics are its own, not the loop's

    # The objective's state went into the checkpoint by name and came back on resume.
    saved = json.loads((split / "checkpoint-1" / "extra_state.json").read_text())["tree"]["state"]
    assert saved["objective"]["updates"] == 1
    # --toy_baseline_decay 0.25 reached the objective: baseline = 0.25 * 0 + 0.75 * the first mean reward
    assert saved["objective"]["baseline"] == pytest.approx(0.75 * rows[0]["reward_mean"])
    config = json.loads((split / "config.json").read_text())
    assert config["plugins"] == {"toy": {"baseline_decay": 0.25}, "toy_family": {"decode_gain": 1.5}}
    assert config["derived"]["trained_steps_per_sample"] == 1  # the toy objective's, not GRPO's
    assert saved["trainer"]["iteration"] == 1 and saved["sampler"]["position"] == 1
    final_straight = load_file(str(straight / "checkpoint-2" / "diffusion_pytorch_model.safetensors"))
    final_split = load_file(str(split / "checkpoint-2" / "diffusion_pytorch_model.safetensors"))
    base = load_file(str(next((model / "transformer").glob("*.safetensors"))))
    assert set(final_straight) == set(base)
    assert all(torch.equal(final_straight[k], final_split[k]) for k in final_straight)
    assert any(not torch.equal(final_straight[k], base[k]) for k in base)  # it trained
    config = json.loads((straight / "checkpoint-2" / "config.json").read_text())
    assert config["_class_name"] == "ToyTransformer"


def test_the_plugins_read_only_their_own_settings(tmp_path):
    """Their flags are parsed, checked, written to config.json and read back through --config; their
    code reads nothing of another component's settings (no TrainConfig, no GRPO section)."""
    sys.path.insert(0, str(HERE))
    import toy_plugins
    from fastvideo.config import parse_config
    from fastvideo.training.builders import build_family

    argv = ["--data_json_path", "d.json", "--pretrained_model_name_or_path", "m", "--rewards", "compressibility:1",
            "--use_group", "--algorithm", OBJECTIVE, "--model_family", FAMILY, "--toy_baseline_decay", "0.1",
            "--toy_decode_gain", "3"]
    cfg = parse_config(argv)
    assert cfg.plugins == {"toy": toy_plugins.ToySettings(0.1), "toy_family": toy_plugins.ToyFamilySettings(3.0)}
    assert cfg.objective_settings() is cfg.plugins["toy"]
    assert build_family(cfg).decode_gain == 3.0
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg.to_json(), "derived": cfg.derived(1), "device": "cpu"}))
    assert parse_config(["--config", str(path)]).to_dict() == cfg.to_dict()
    with pytest.raises(SystemExit):  # a plugin's flag is refused without its plugin
        parse_config(argv[:7] + ["--toy_decode_gain", "3"])
    source = inspect.getsource(toy_plugins)
    assert "cfg" not in source and "grpo" not in source.lower().replace("fastvideo", "")


def test_plugin_names_that_do_not_resolve_fail_with_the_valid_names(toy_run_inputs, tmp_path):
    out = tmp_path / "bad"
    cmd = [sys.executable, str(ROOT / "fastvideo" / "train_grpo_flux.py"),
           *_argv(toy_run_inputs, out, 1, algorithm="toy_plugins:Missing")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "cannot load 'Missing'" in proc.stderr and "Traceback" not in proc.stderr
