"""End to end through the trainer (`python -m fastvideo.train_grpo_flux`): two 1-iteration CPU
runs with the same seed record identical runs, and a run with another seed that replays the first
run's captured randomness reproduces it. compare_runs judges both pairs.

Run A goes through the command line (a subprocess); B and C call the same entry point
in-process to keep the file fast.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fastvideo.sampling.randomness import RandomSource
from fastvideo.tools.compare_runs import main as compare_main

REPO = Path(__file__).resolve().parents[2]

SEED, OTHER_SEED = 3, 11


@pytest.fixture(scope="module")
def data_json(tiny_flux_dir, tmp_path_factory):
    from fastvideo.data_preprocess.preprocess_flux_embedding import main as preprocess

    out = tmp_path_factory.mktemp("embeddings")
    preprocess(["--model_path", str(tiny_flux_dir), "--prompt_dir", str(REPO / "assets" / "prompts_tiny.txt"),
                "--output_dir", str(out), "--max_sequence_length", "32", "--dataloader_num_workers", "0"])
    return out / "videos2caption.json"


def _argv(data_json, model, root: Path, seed: int, *extra) -> list[str]:
    return ["--data_json_path", str(data_json), "--pretrained_model_name_or_path", str(model),
            "--rewards", "compressibility:1.0", "--h", "64", "--w", "64", "--sampling_steps", "4", "--eta", "0.3",
            "--num_generations", "2", "--train_batch_size", "1", "--max_train_steps", "1",
            "--mixed_precision", "no", "--use_group", "--seed", str(seed),
            "--output_dir", str(root / "out"), "--record_dir", str(root / "rec"), "--record_tensors", *extra]


def _train_in_process(argv) -> None:
    from fastvideo.train_grpo_flux import main

    assert main(argv) == 0


@pytest.fixture(scope="module")
def run_a(data_json, tiny_flux_dir, tmp_path_factory):
    """Seed 3 through the CLI, capturing its randomness and probing every layer kind."""
    root = tmp_path_factory.mktemp("run_a")
    argv = _argv(data_json, tiny_flux_dir, root, SEED, "--dump_randomness", str(root / "draws"),
                 "--probe_layers", "all")
    env = dict(os.environ, HF_HUB_OFFLINE="1", FASTVIDEO_DEVICE="cpu")
    proc = subprocess.run([sys.executable, "-m", "fastvideo.train_grpo_flux", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


def test_same_seed_runs_compare_identical(run_a, data_json, tiny_flux_dir, tmp_path):
    _train_in_process(_argv(data_json, tiny_flux_dir, tmp_path, SEED, "--dump_randomness", str(tmp_path / "draws"),
                            "--probe_layers", "all"))
    for rec in (run_a / "rec", tmp_path / "rec"):
        assert (rec / "manifest.json").is_file() and (rec / "iter_000001" / "metrics.json").is_file()
        assert (rec / "probes" / "probes.json").is_file(), "the trainer did not run the probes (--probe_layers)"
    out = tmp_path / "report"
    assert compare_main([str(run_a / "rec"), str(tmp_path / "rec"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (it,) = summary["iterations"]
    assert it["reward"]["n"] == 2 and it["reward"]["max_rel"] == 0.0
    assert it["min_psnr"] == "inf" and it["tensors"]["initial_noise_max_rel"] == 0.0
    assert {c["name"]: c["passed"] for c in summary["checks"]}["layers"] is True


def test_replay_with_another_seed_reproduces(run_a, data_json, tiny_flux_dir, tmp_path):
    _train_in_process(_argv(data_json, tiny_flux_dir, tmp_path, OTHER_SEED, "--load_randomness", str(run_a / "draws")))
    out = tmp_path / "report"
    assert compare_main([str(run_a / "rec"), str(tmp_path / "rec"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (it,) = summary["iterations"]
    assert it["reward"]["max_rel"] == 0.0 and it["max_pixel_diff"] == 0
    assert it["tensors"]["initial_noise_max_rel"] == 0.0 and it["tensors"]["latents_final_max_rel"] == 0.0
    # ...and the replay is what made them equal: seed 11's own noise is different.
    tensors = load_file(str(tmp_path / "rec" / "iter_000001" / "tensors_rank00000.safetensors"))
    key = sorted(k for k in tensors if k.startswith("initial_noise/"))[0]
    sid, noise = int(key.split("/")[1]), tensors[key]
    own = RandomSource(OTHER_SEED).initial_noise(1, [sid], noise.shape)[0]
    captured = RandomSource(SEED).initial_noise(1, [sid], noise.shape)[0]
    assert not torch.allclose(own, noise)
    torch.testing.assert_close(captured, noise, rtol=0, atol=0)
