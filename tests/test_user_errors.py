"""Bad input, tried as a new user would: each is refused with its message alone (no traceback) and
exit status 2; FASTVIDEO_DEBUG=1 adds the traceback; a real bug keeps its traceback (exit 1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "training"))
from helpers import train_args  # noqa: E402
from fastvideo.models.flux.family import FluxFamily

FLUX = FluxFamily()  # the family of these tests' records (FLUX's)


def _train(argv, monkeypatch) -> int:
    from fastvideo.train_grpo_flux import main

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own errors
        return stop.code


def _preprocess(argv, monkeypatch) -> int:
    from fastvideo.data_preprocess.preprocess_flux_embedding import cli

    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    return cli(argv)


def _refused(code, capsys, *needles):
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in err, (needle, err[-2000:])
    return err


@pytest.fixture(scope="module")
def finished_run(tiny_flux_dir, tiny_embeddings, tmp_path_factory):
    """A 1-iteration run with its checkpoint-1 (seed 7)."""
    from fastvideo.train_grpo_flux import main

    out = tmp_path_factory.mktemp("finished") / "run"
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=1, checkpointing_steps=1,
                      save_images_every=0, fsdp_sharding_strategy="none")
    assert main(argv) == 0
    return out, argv


def _bad_hps(folder: Path, what: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if what == "garbage":
        (folder / "open_clip_pytorch_model.bin").write_bytes(b"not a checkpoint at all")
        (folder / "HPS_v2.1_compressed.pt").write_bytes(b"nor this")
    return folder


def _other_encoder_embeddings(root: Path) -> Path:
    """Embeddings as another text encoder would write them: 64-wide instead of the tiny T5's width."""
    from fastvideo.data_preprocess.embeddings import save_prompt_record, write_caption_json

    for sub in ("prompt_embed", "pooled_prompt_embeds", "text_ids"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i in range(8):
        save_prompt_record(root, i, {"prompt_embeds": torch.zeros(32, 64), "pooled": torch.zeros(16),
                                     "text_ids": torch.zeros(32, 3)}, family=FLUX)
    return write_caption_json(root, [f"prompt {i}" for i in range(8)], family=FLUX)


def test_training_inputs_are_refused_cleanly(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch, capsys):
    t = lambda **kw: train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "o", max_train_steps=1, **kw)  # noqa: E731
    # 1 missing model folder, 2 incomplete model folder
    _refused(_train(train_args(tiny_embeddings, tmp_path / "no_model", tmp_path / "o"), monkeypatch), capsys,
             "make_tiny_flux")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "model_index.json").write_text((Path(tiny_flux_dir) / "model_index.json").read_text())
    _refused(_train(train_args(tiny_embeddings, partial, tmp_path / "o"), monkeypatch), capsys, "transformer")
    # 3 missing data index
    _refused(_train(train_args(tmp_path / "nope.json", tiny_flux_dir, tmp_path / "o"), monkeypatch), capsys,
             "nope.json", "preprocessing")
    # 4 embeddings from another text encoder
    other = _other_encoder_embeddings(tmp_path / "other")
    _refused(_train(train_args(other, tiny_flux_dir, tmp_path / "o"), monkeypatch), capsys, "preprocess")
    # 5 missing HPS files, 6 malformed HPS files
    _refused(_train(t(rewards="hpsv2:1", hps_ckpt_dir=str(tmp_path / "no_hps")), monkeypatch), capsys,
             "no_hps", "HPS")
    bad = _bad_hps(tmp_path / "bad_hps", "garbage")
    _refused(_train(t(rewards="hpsv2:1", hps_ckpt_dir=str(bad)), monkeypatch), capsys, "not a readable")
    # 7 impossible flags, 8 unknown reward, 9 contradicting reward flags (argparse: usage + message)
    _refused(_train(t(sp_size=2), monkeypatch), capsys, "does not divide the world size 1")
    _refused(_train(t(rewards="aesthetics:1"), monkeypatch), capsys, "aesthetics")
    _refused(_train(t(use_hpsv2=True), monkeypatch), capsys, "either with --rewards")
    # 10 one sample in all without --use_group
    _refused(_train(t(use_group=None, num_generations=1, train_batch_size=1), monkeypatch), capsys,
             "at least 2")


def test_resume_inputs_are_refused_cleanly(finished_run, tmp_path, monkeypatch, capsys):
    import fastvideo.training.builders as builders

    out, argv = finished_run

    def no_models(*args, **kwargs):
        raise AssertionError("a refused resume must not load any model")

    monkeypatch.setattr(builders, "build_models", no_models)
    # 11 another seed (and sampler seed): fails before any model loads, naming both values
    i = argv.index("--seed")
    changed = argv[:i] + ["--seed", "8"] + argv[i + 2:] + ["--resume_from_checkpoint", "latest"]
    err = _refused(_train(changed, monkeypatch), capsys, "seed (--seed): checkpoint 7, this run 8",
                   "sampler_seed (--sampler_seed): checkpoint 7, this run 8", "--resume_allow_changes")
    assert "num_generations" not in err
    # 12 another group size and schedule
    more = [*argv, "--resume_from_checkpoint", "latest", "--num_generations", "4", "--shift", "2.5"]
    _refused(_train(more, monkeypatch), capsys, "num_generations (--num_generations): checkpoint 2, this run 4",
             "shift (--shift): checkpoint 3.0, this run 2.5")
    # 13 no checkpoint to resume from, 14 a damaged one, 15 a pickled object inside one
    empty = [a if a != str(out) else str(tmp_path / "empty") for a in argv] + ["--resume_from_checkpoint", "latest"]
    _refused(_train(empty, monkeypatch), capsys, "no complete checkpoint-N folder")
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(out / "checkpoint-1", damaged)
    with open(damaged / "diffusion_pytorch_model.safetensors", "r+b") as f:
        f.truncate(100)
    _refused(_train([*argv, "--resume_from_checkpoint", str(damaged)], monkeypatch), capsys, "damaged")
    flipped = tmp_path / "flipped"  # same size, one bit changed: found by its sha256
    shutil.copytree(out / "checkpoint-1", flipped)
    with open(flipped / "diffusion_pytorch_model.safetensors", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    err = _refused(_train([*argv, "--resume_from_checkpoint", str(flipped)], monkeypatch), capsys,
                   "diffusion_pytorch_model.safetensors does not match its sha256")
    assert err.count("\n") == 1, err
    pickled = tmp_path / "pickled"
    shutil.copytree(out / "checkpoint-1", pickled)
    import json

    torch.save({"x": Path("evil")}, pickled / "extra_state.safetensors")
    marker = json.loads((pickled / "COMPLETE.json").read_text())
    marker["files"]["extra_state.safetensors"] = (pickled / "extra_state.safetensors").stat().st_size
    from fastvideo.training.checkpoint import file_digest

    marker["sha256"]["extra_state.safetensors"] = file_digest(pickled / "extra_state.safetensors")
    (pickled / "COMPLETE.json").write_text(json.dumps(marker))
    _refused(_train([*argv, "--resume_from_checkpoint", str(pickled)], monkeypatch), capsys, "pickle")


def test_a_refused_resume_under_the_launcher_prints_every_difference(finished_run, tmp_path):
    """Issue #39 item 16: under fastvideo.launch the refusal is one line holding every difference
    (the launcher reads the first line a rank writes; the differences used to be lines of their own)."""
    import os
    import subprocess

    out, argv = finished_run
    i = argv.index("--seed")
    changed = argv[:i] + ["--seed", "8"] + argv[i + 2:] + ["--resume_from_checkpoint", "latest", "--shift", "2.5"]
    root = Path(__file__).resolve().parents[1]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(root), "FASTVIDEO_DEVICE": "cpu",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "FASTVIDEO_PREFLIGHT": "0"}
    proc = subprocess.run([sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=1",
                           "fastvideo/train_grpo_flux.py", *changed], env=env, cwd=root, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("+ torchrun")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1, lines
    for needle in ("not the run that was saved", "seed (--seed): checkpoint 7, this run 8",
                   "shift (--shift): checkpoint 3.0, this run 2.5", "--resume_allow_changes"):
        assert needle in lines[0], (needle, lines[0])


def test_resume_allow_changes_logs_the_differences(finished_run, monkeypatch, capsys):
    out, argv = finished_run
    i = argv.index("--max_train_steps")
    more = argv[:i] + ["--max_train_steps", "2"] + argv[i + 2:]
    more += ["--resume_from_checkpoint", "latest", "--seed", "9", "--resume_allow_changes", "--output_dir",
             str(out)]
    assert _train(more, monkeypatch) == 0
    assert "continuing with a changed setting: seed (--seed): checkpoint 7, this run 9" in capsys.readouterr().out


def test_the_non_finite_stop_is_one_line_exit_2(tiny_flux_dir, tiny_embeddings, tmp_path, monkeypatch, capsys):
    """Issue #39 item 17: --max_nonfinite_steps reached is one line naming the setting to change (exit 2),
    not a NonFiniteError traceback. Every iteration is made to report a skipped non-finite step."""
    import fastvideo.training.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "iteration_problems",
                        lambda record, stats: ["non-finite loss in 1 of 1 optimizer step(s) (skipped)"])
    argv = train_args(tiny_embeddings, tiny_flux_dir, tmp_path / "o", max_train_steps=3, max_nonfinite_steps=2,
                      save_images_every=0, fsdp_sharding_strategy="none")
    err = _refused(_train(argv, monkeypatch), capsys, "2 iterations in a row had non-finite values",
                   "--learning_rate")
    assert err.count("\n") == 1, err


SAFETENSORS_ENOSPC = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'


@pytest.mark.parametrize("where", ["checkpoint", "metrics"])
def test_a_full_disk_is_one_line_naming_the_file_and_the_last_checkpoint(where, tiny_flux_dir, tiny_embeddings,
                                                                          tmp_path, monkeypatch, capsys):
    """Issue #39 item 18: ENOSPC while writing checkpoint-2's weights (safetensors' own error type) or
    a metrics line: one line naming what was written and checkpoint-1, exit 2; nothing half-written
    is left as a checkpoint."""
    import json
    from types import SimpleNamespace

    import fastvideo.training.checkpoint as checkpoint
    import fastvideo.training.metrics as metrics

    calls = {"n": 0}
    real_tensors = checkpoint._write_tensors

    def full_tensors(path, tensors):
        if "checkpoint-2" in str(path):
            raise Exception(SAFETENSORS_ENOSPC)  # noqa: TRY002 - what safetensors raises
        real_tensors(path, tensors)

    def full_dumps(obj, **kwargs):  # the metrics line of iteration 2 meets a full disk as it is written
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")  # as a file object's write() raises it: no file name
        return json.dumps(obj, **kwargs)

    monkeypatch.setattr(*((checkpoint, "_write_tensors", full_tensors) if where == "checkpoint" else
                          (metrics, "json", SimpleNamespace(dumps=full_dumps))))
    out = tmp_path / "o"
    argv = train_args(tiny_embeddings, tiny_flux_dir, out, max_train_steps=2, checkpointing_steps=1,
                      save_images_every=0, fsdp_sharding_strategy="none")
    named = "diffusion_pytorch_model.safetensors" if where == "checkpoint" else "metrics.jsonl"
    err = _refused(_train(argv, monkeypatch), capsys, "o space left on device", named,
                   f"the last complete checkpoint is {out / 'checkpoint-1'}", "--resume_from_checkpoint latest")
    assert err.count("\n") == 1, err
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]


def test_prompt_files_are_refused_cleanly(tiny_flux_dir, tmp_path, monkeypatch, capsys):
    # 16 an empty prompt file, 17 a prompt file that is not UTF-8
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    args = ["--model_path", str(tiny_flux_dir), "--output_dir", str(tmp_path / "emb")]
    _refused(_preprocess(["--prompt_dir", str(empty), *args], monkeypatch), capsys, "empty.txt")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    _refused(_preprocess(["--prompt_dir", str(latin), *args], monkeypatch), capsys, "UTF-8")


def test_debug_shows_the_traceback_and_bugs_keep_theirs(capsys, monkeypatch):
    from fastvideo.config import ConfigError
    from fastvideo.errors import report_failure

    def raised(exc):
        try:
            raise exc
        except Exception as caught:  # noqa: BLE001
            return caught

    assert report_failure(raised(ConfigError("bad flag")), "prog") == 2
    err = capsys.readouterr().err
    assert err == "prog: error: bad flag\n"
    monkeypatch.setenv("FASTVIDEO_DEBUG", "1")
    assert report_failure(raised(ConfigError("bad flag")), "prog") == 2
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.delenv("FASTVIDEO_DEBUG")
    assert report_failure(raised(KeyError("bug")), "prog", rank=1) == 1
    err = capsys.readouterr().err
    assert err.startswith("[rank 1] prog failed: KeyError") and "Traceback" in err
