"""Checkpoints: exact round trips (1 and 2 ranks under FSDP), atomic saves, pruning, resume errors,
pickle refusal, and export to a diffusers folder."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from dist_utils import run_distributed, tiny_inputs, tiny_transformer

from fastvideo import devices
from fastvideo.distributed import fsdp
from fastvideo.training import checkpoint
from fastvideo.training.checkpoint import (
    Checkpointer,
    CheckpointError,
    NoCheckpointError,
    find_latest,
)
from fastvideo.training.ema import EMA


# ---------------------------------------------------------------- a small training state
def weighted_loss(out: torch.Tensor) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
    return (out * w).sum() + out.square().mean()


def training_state(model):
    from diffusers.optimization import get_scheduler

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=2, num_training_steps=10)
    return optimizer, scheduler, EMA(model, decay=0.9)


def train_step(model, optimizer, scheduler, ema, seed: int) -> None:
    weighted_loss(model(**tiny_inputs(seed))[0]).backward()
    fsdp.clip_grad_norm(model, 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    ema.update(model)


def snapshot(model, optimizer, scheduler, ema) -> dict:
    """Everything a resume must restore, gathered (rank 0; other ranks get empty dicts)."""
    return {
        "model": {k: v.clone() for k, v in fsdp.full_model_state_dict(model).items()},
        "optimizer": checkpoint.decode_tree(*_encoded(fsdp.full_optimizer_state_dict(model, optimizer))),
        "scheduler": scheduler.state_dict(),
        "ema": ema.full_state_dict(model),
    }


def _encoded(tree):
    tensors: dict = {}
    enc = checkpoint.encode_tree(tree, tensors)
    return enc, {k: v.clone() for k, v in tensors.items()}


def assert_tree_equal(a, b, where="state"):
    """Bit-for-bit equality of nested containers (tensors by torch.equal and dtype)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_tree_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {type(a)} {type(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_tree_equal(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def extras(rank: int) -> tuple[dict, dict]:
    gen = torch.Generator().manual_seed(77 + rank)
    torch.randn(3, generator=gen)  # advance it: a non-initial state
    shared = {
        "iteration": 2,
        "sampler": {"epoch": 1, "order": [3, 1, 2], "position": (1, 2)},
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.RandomState(5).get_state(),
        "python_rng": random.Random(5).getstate(),
        "by_id": {1: "a", 2: None},
        "lr_scale": float("inf"),
        "dtype": torch.bfloat16,
    }
    return shared, {"rank": rank, "generator": gen.get_state()}


# ---------------------------------------------------------------- round trip (1 or 2 ranks)
def _round_trip(info, out_dir: str, strategy: str):
    def wrap(seed):
        return fsdp.wrap_model(tiny_transformer(seed), strategy, info.device, gradient_checkpointing=True)

    model = wrap(0)
    state = training_state(model)
    for step in (1, 2):
        train_step(model, *state, seed=10 * step + info.rank)
    shared, own = extras(info.rank)
    ckpt = Checkpointer(out_dir, keep_last=2)
    path = ckpt.save(2, model=model, optimizer=state[0], lr_scheduler=state[1], ema=state[2], extra=shared,
                     rank_state=own)
    saved = snapshot(model, *state)
    train_step(model, *state, seed=30 + info.rank)
    uninterrupted = snapshot(model, *state)

    # A fresh run with different initial weights resumes from 'latest' and takes the same step.
    fresh = wrap(1)
    fresh_state = training_state(fresh)
    loaded_extra = ckpt.load("latest", model=fresh, optimizer=fresh_state[0], lr_scheduler=fresh_state[1],
                             ema=fresh_state[2])
    assert_tree_equal(loaded_extra, shared, "extra")
    loaded = checkpoint.load_checkpoint(path, fresh)  # model only; per-rank state comes back too
    assert_tree_equal(loaded.rank_state, own, "rank_state")
    assert loaded.iteration == 2 and fresh_state[2].num_updates == 2
    restored = snapshot(fresh, *fresh_state)
    assert_tree_equal(restored, saved, "restored")
    train_step(fresh, *fresh_state, seed=30 + info.rank)
    assert_tree_equal(snapshot(fresh, *fresh_state), uninterrupted, "after one more step")

    # A problem seen by one rank makes every rank raise (none is left waiting in a collective).
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.load(str(Path(out_dir) / "checkpoint-99"), model=fresh)
    bad_own = {"rank": info.rank, "oops": object()} if info.rank == info.world_size - 1 else own
    with pytest.raises((CheckpointError, TypeError), match="cannot be stored|nothing was published"):
        ckpt.save(3, model=fresh, extra=shared, rank_state=bad_own)
    assert find_latest(out_dir) == path and not any(".tmp-" in p for p in os.listdir(out_dir))
    return saved if info.rank == 0 else None


def test_round_trip_single_process(tmp_path):
    info = devices.DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    saved = _round_trip(info, str(tmp_path), "full")
    assert find_latest(tmp_path) == tmp_path / "checkpoint-2"
    assert set(saved["model"]) == set(tiny_transformer().state_dict())


def test_round_trip_fsdp_two_ranks_then_one(tmp_path):
    """Save under FSDP on 2 ranks; a fresh FSDP model resumes bit for bit and its next step equals
    the uninterrupted run's. Then one process (world size 1) loads the same checkpoint."""
    saved, _ = run_distributed(_round_trip, str(tmp_path), "full")
    path = find_latest(tmp_path)
    files = json.loads((path / checkpoint.MARKER).read_text())["files"]
    assert {"rank_state/rank-00000.json", "rank_state/rank-00001.json", "diffusion_pytorch_model.safetensors"} <= set(files)

    model = tiny_transformer(1)
    optimizer, scheduler, ema = training_state(model)
    with pytest.warns(UserWarning, match="per-rank state is not restored"):
        loaded = checkpoint.load_checkpoint(path, model, optimizer, scheduler, ema)
    assert loaded.rank_state is None
    assert_tree_equal(by_name(snapshot(model, optimizer, scheduler, ema)), by_name(saved), "world size 1")


def by_name(snap: dict) -> dict:
    """The optimizer lists its parameters in wrapping order (FSDP puts the root's first); compare
    them as a set of names when world sizes differ."""
    for group in snap["optimizer"]["param_groups"]:
        group["params"] = sorted(group["params"])
    return snap


# ---------------------------------------------------------------- atomic saves and pruning
def _plain_state(seed=0):
    model = tiny_transformer(seed)
    return (model, *training_state(model))


def _save(ckpt, iteration, state, **extra):
    model, optimizer, scheduler, ema = state
    return ckpt.save(iteration, model=model, optimizer=optimizer, lr_scheduler=scheduler, ema=ema,
                     extra={"iteration": iteration, **extra})


def test_interrupted_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    ckpt = Checkpointer(tmp_path, keep_last=3)
    state = _plain_state()
    train_step(*state, seed=1)
    _save(ckpt, 1, state)
    at_one = snapshot(*state)
    train_step(*state, seed=2)

    written = []
    real_write = checkpoint._write_tensors

    def fail_on_second_file(path, tensors):
        written.append(path.name)
        if len(written) == 2:
            raise OSError("disk full (simulated)")
        real_write(path, tensors)

    from fastvideo.training.checkpoint import state_io

    # Every tensor file goes through one writer, whichever module calls it.
    monkeypatch.setattr(checkpoint, "_write_tensors", fail_on_second_file)
    monkeypatch.setattr(state_io, "_write_tensors", fail_on_second_file)
    with pytest.raises(OSError, match="simulated"):
        _save(ckpt, 2, state)
    assert written == ["diffusion_pytorch_model.safetensors", "optimizer.safetensors"]  # the model file had been written
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1"]  # the partial folder is gone
    monkeypatch.undo()

    # A process killed mid-save leaves its temporary folder; a folder may also lack the marker.
    dead = tmp_path / "checkpoint-3.tmp-killed"
    dead.mkdir()
    shutil.copy(tmp_path / "checkpoint-1" / "diffusion_pytorch_model.safetensors", dead)
    unmarked = tmp_path / "checkpoint-9"
    shutil.copytree(tmp_path / "checkpoint-1", unmarked)
    (unmarked / checkpoint.MARKER).unlink()
    assert find_latest(tmp_path) == tmp_path / "checkpoint-1"

    fresh = _plain_state(seed=1)
    extra = Checkpointer(tmp_path).load("latest", model=fresh[0], optimizer=fresh[1], lr_scheduler=fresh[2],
                                        ema=fresh[3])
    assert extra["iteration"] == 1
    assert_tree_equal(snapshot(*fresh), at_one, "resumed")
    with pytest.raises(CheckpointError, match="COMPLETE.json is missing"):
        ckpt.load(str(unmarked), model=fresh[0])
    with pytest.raises(CheckpointError, match="did not finish"):
        ckpt.load(str(dead), model=fresh[0])

    _save(ckpt, 2, state)  # the next save clears the leftovers of the killed one
    assert not dead.exists() and find_latest(tmp_path) == tmp_path / "checkpoint-2"
    assert [i for i, _ in checkpoint.list_checkpoints(tmp_path)] == [1, 2]  # 9 has no marker


def test_keep_last_and_resave(tmp_path):
    model = tiny_transformer()
    ckpt = Checkpointer(tmp_path, keep_last=2)
    for it in (1, 2, 3, 4):
        ckpt.save(it, model=model, extra={"iteration": it})
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-3", "checkpoint-4"]
    ckpt.save(4, model=model, extra={"iteration": 4, "again": True})  # same iteration: replaced
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-3", "checkpoint-4"]
    assert ckpt.load("latest", model=model)["again"] is True


def test_resume_errors_are_clear(tmp_path):
    model = tiny_transformer()
    with pytest.raises(NoCheckpointError, match="no complete checkpoint-N folder"):
        Checkpointer(tmp_path).load("latest", model=model)
    with pytest.raises(NoCheckpointError, match="does not exist"):
        Checkpointer(tmp_path).load(str(tmp_path / "checkpoint-7"), model=model)
    path = Checkpointer(tmp_path).save(5, model=model)
    with pytest.raises(CheckpointError, match="It holds checkpoint folders"):
        Checkpointer(tmp_path).load(str(tmp_path), model=model)
    with pytest.raises(CheckpointError, match="no EMA weights"):
        Checkpointer(tmp_path).load("latest", model=model, ema=EMA(model, 0.9))
    with open(path / "diffusion_pytorch_model.safetensors", "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError, match="damaged: diffusion_pytorch_model.safetensors"):
        Checkpointer(tmp_path).load("latest", model=model)


class Payload:
    """Unpickling this would create a file: proof that a load executed pickled code."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (Path.touch, (self.flag,))


def test_pickle_is_never_written_or_loaded(tmp_path):
    model = tiny_transformer()
    ckpt = Checkpointer(tmp_path / "out")
    with pytest.raises(TypeError, match=r"extra_state\.sampler\.rng: a .*Random cannot be stored"):
        ckpt.save(1, model=model, extra={"sampler": {"rng": random.Random(0)}})
    assert not (tmp_path / "out" / "checkpoint-1").exists()

    path = ckpt.save(2, model=model, extra={"iteration": 2})
    flag = tmp_path / "pwned"
    for name in ("diffusion_pytorch_model.safetensors", "extra_state.json"):
        victim = path / name
        backup = victim.read_bytes()
        torch.save({"x": Payload(flag)}, victim)
        marker = json.loads((path / checkpoint.MARKER).read_text())
        marker["files"][name] = victim.stat().st_size  # a consistent-looking, malicious checkpoint
        marker["sha256"][name] = checkpoint.file_digest(victim)
        (path / checkpoint.MARKER).write_text(json.dumps(marker))
        with pytest.raises(CheckpointError, match="without pickle"):
            ckpt.load("latest", model=model)
        victim.write_bytes(backup)
        marker["files"][name] = len(backup)
        marker["sha256"][name] = checkpoint.file_digest(victim)
        (path / checkpoint.MARKER).write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match="refusing to load"):
        torch.save({"x": Payload(flag)}, tmp_path / "foreign.pt")
        from fastvideo.rewards.base import load_weights_only

        load_weights_only(tmp_path / "foreign.pt")
    assert not flag.exists()
    assert ckpt.load("latest", model=model)["iteration"] == 2  # restored files load again


def test_tree_codec_round_trip():
    shared, own = extras(0)
    tree = {"shared": shared, "own": own, "bytes": b"\x00\xff", "nested": [(1, 2.5, None), {"__x": 1}],
            "scalar": np.float32(1.5), "empty": torch.empty(0)}
    enc, tensors = _encoded(tree)
    decoded = checkpoint.decode_tree(json.loads(json.dumps(enc)), tensors)
    tree["scalar"] = 1.5  # numpy scalars come back as Python numbers
    assert_tree_equal(decoded, tree)


# ---------------------------------------------------------------- export
def test_export_loads_in_diffusers(tmp_path, tiny_flux_dir, capsys):
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from safetensors.torch import load_file

    from fastvideo.models import flux
    from fastvideo.tools import export

    model = flux.load_transformer(tiny_flux_dir)
    optimizer, scheduler, ema = training_state(model)
    for seed in (1, 2):
        train_step(model, optimizer, scheduler, ema, seed)
    path = Checkpointer(tmp_path / "run").save(2, model=model, ema=ema, transformer_config=dict(model.config))
    policy, averaged = load_file(path / "diffusion_pytorch_model.safetensors"), load_file(path / "ema.safetensors")
    assert not torch.equal(policy["proj_out.weight"], averaged["proj_out.weight"])

    for use_ema, want in ((False, policy), (True, averaged)):
        out = export.export_checkpoint(path, tmp_path / f"transformer-{use_ema}", ema=use_ema)
        loaded = FluxTransformer2DModel.from_pretrained(out).state_dict()
        assert set(loaded) == set(want)
        for k in want:
            assert torch.equal(loaded[k], want[k]), k

    export.main([str(path), str(tmp_path / "pipe"), "--ema", "--base", str(tiny_flux_dir), "--dtype", "bf16"])
    pipe = FluxPipeline.from_pretrained(tmp_path / "pipe", torch_dtype=torch.bfloat16)
    for k, v in pipe.transformer.state_dict().items():
        assert torch.equal(v, averaged[k].to(torch.bfloat16)), k
    with pytest.raises(SystemExit) as stop:  # a user error: exit 2, the message alone
        export.main([str(path), str(tmp_path / "pipe")])
    assert stop.value.code == 2
    assert "exists and is not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export.main([str(Checkpointer(tmp_path / "run2").save(1, model=model)), str(tmp_path / "x"), "--ema"])
    err = capsys.readouterr().err
    assert "no ema.safetensors" in err and "Traceback" not in err


# ---------------------------------------------------------------- stateful parts by name
class _Counter:
    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def test_stateful_parts_are_saved_and_restored_by_name(tmp_path):
    from fastvideo.training.update import TrainerState

    model = tiny_transformer()
    ckpt = Checkpointer(tmp_path)
    ckpt.save(3, model=model, states={"trainer": TrainerState(3, 1), "counter": _Counter(7)})
    state, counter = TrainerState(), _Counter()
    extra = ckpt.load("latest", model=model, states={"trainer": state, "counter": counter})
    assert (state.iteration, state.consecutive_nonfinite, counter.value) == (3, 1, 7)
    assert extra["state"]["counter"] == {"value": 7}
    with pytest.raises(CheckpointError, match="no state for 'missing'"):
        ckpt.load("latest", model=model, states={"missing": _Counter()})


def test_a_checkpoint_without_named_states_resumes(tmp_path):
    """Checkpoints written before the parts were saved by name (919d5af) kept the trainer's counters
    and the sampler at the top level of extra_state."""
    from fastvideo.training.update import TrainerState

    model = tiny_transformer()
    sampler = {"epoch": 1, "position": 2}
    Checkpointer(tmp_path).save(5, model=model, extra={"iteration": 5, "consecutive_nonfinite": 2,
                                                       "sampler": sampler, "seed": 42})
    state, got = TrainerState(), {}

    class Sampler:
        def load_state_dict(self, s):
            got.update(s)

    Checkpointer(tmp_path).load("latest", model=model, states={"trainer": state, "sampler": Sampler()})
    assert (state.iteration, state.consecutive_nonfinite, got) == (5, 2, sampler)
