"""--checkpoint_format sharded under the other wrappings: hybrid sharding (replicas across nodes),
hybrid_zero2, DDP, CPU offload and LoRA (its frozen base replicated, or sharded with an adapter
unit per Linear as under CPU offload).

For each mode one 2-rank run trains 2 steps, writes the checkpoint in both formats from the same
state and checks, on every rank: the sharded checkpoint resumes bit-exactly under the same mode
(weights, AdamW state, EMA, and the step after); loaded under another layout (2-rank full
sharding; LoRA: the replicated-base layout) it gives the same state as the gathered format, whose
load goes through torch's own state-dict API. Replicas write no shard files of their own. The
test process then loads every checkpoint on 1 process. A 4-rank run covers HYBRID_SHARD proper
(2 nodes x 2 ranks), loaded again on 4 ranks of full sharding.

CPU offload cannot be switched on for a CPU device (wrap_model drops it, there is nothing to
offload to); the children call fsdp's FSDP wrapper with it on and stand in for the two accelerator
calls FSDP makes (pinning the host shards, synchronising the device stream) with no-ops."""

from __future__ import annotations

import json

import pytest
import torch
from dist_utils import loss_fn, run_distributed, tiny_inputs, tiny_transformer

LORA_TARGETS = ("to_k", "to_q", "to_v", "to_out.0")

# mode -> (strategy, LOCAL_WORLD_SIZE, cpu offload, LoRA); 2 ranks unless named
MODES = {
    "hybrid_replicas": ("hybrid", 1, False, False),  # 2 nodes x 1 rank: FSDP NO_SHARD, 2 replicas
    "hybrid_zero2_one_node": ("hybrid_zero2", 2, False, False),  # 1 node: SHARD_GRAD_OP
    "ddp": ("none", 2, False, False),
    "cpu_offload": ("full", 2, True, False),
    "lora": ("full", 2, False, True),  # the base replicated, one unit of adapters per block
    "lora_cpu_offload": ("full", 2, True, True),  # the base sharded, an adapter unit per Linear
}
FOUR_RANK_MODE = {"hybrid_2x2": ("hybrid", 2, False, False)}  # HYBRID_SHARD on a (2, 2) mesh
# the layout each mode's checkpoint is also loaded into (another wrapping of the same model)
CROSS = {False: ("full", 2, False, False), True: ("full", 2, False, True)}


def _offload_on_cpu() -> None:
    """The host stands in for the device: pinning and stream synchronisation become no-ops."""
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    torch.cpu.Stream.synchronize = lambda self: None


def _build(info, mode: tuple, seed: int = 0):
    """The tiny transformer wrapped as ``mode`` says, fused/foreach AdamW and an EMA."""
    import os

    from fastvideo import devices
    from fastvideo.distributed import fsdp
    from fastvideo.distributed.checkpointing import default_block_classes
    from fastvideo.training import lora
    from fastvideo.training.ema import EMA

    strategy, local_world, offload, use_lora = mode
    os.environ["LOCAL_WORLD_SIZE"] = str(local_world)  # read by wrap_model (hybrid's mesh)
    model = tiny_transformer(seed)
    if use_lora:
        lora.apply_lora(model, lora.LoraSettings(True, 4, 8.0, 0.0, LORA_TARGETS, None), torch.float32,
                        torch.float32, seed=seed)
    else:
        model.requires_grad_(True)
    if offload:
        _offload_on_cpu()
        model = fsdp._wrap_fsdp(model, strategy, info.device, None, True, tuple(default_block_classes(model)),
                                info.world_size, lora.is_adapter_unit if use_lora else None)
    else:
        model = fsdp.wrap_model(model, strategy, info.device, replicate_frozen=use_lora)
    opt = torch.optim.AdamW(fsdp.trainable_parameters(model), lr=1e-3, weight_decay=1e-4,
                            **devices.adamw_kernel_kwargs(info.device))
    return model, opt, EMA(model, decay=0.9)


def _train(info, model, opt, ema, steps: int) -> None:
    for step in range(steps):
        loss_fn(model, tiny_inputs(info.rank + 10 * step)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(model)


def _state(model, opt, ema) -> dict:
    from fastvideo.distributed import fsdp

    params = fsdp.trainable_parameters(model)
    return {"params": [p.detach().clone() for p in params], "shadow": [s.clone() for s in ema.shadow],
            "opt": [{k: v.clone() for k, v in sorted(opt.state[p].items())} for p in params]}


def _same(a: dict, b: dict) -> bool:
    if len(a["params"]) != len(b["params"]) or not a["params"]:
        return False
    tensors = all(torch.equal(x, y) for k in ("params", "shadow") for x, y in zip(a[k], b[k]))
    opt = all(x.keys() == y.keys() == {"step", "exp_avg", "exp_avg_sq"} and all(torch.equal(x[k], y[k]) for k in x)
              for x, y in zip(a["opt"], b["opt"]))
    return tensors and opt


def _next_params(info, model, opt) -> list[torch.Tensor]:
    from fastvideo.distributed import fsdp

    loss_fn(model, tiny_inputs(info.rank + 99)).backward()
    opt.step()
    return [p.detach().clone() for p in fsdp.trainable_parameters(model)]


def _load(info, mode, path, trainable_only):
    from fastvideo.training.checkpoint import load_checkpoint

    model, opt, ema = _build(info, mode, seed=0)
    load_checkpoint(path, model, opt, ema=ema, trainable_only=trainable_only)
    return model, opt, ema


def _check_mode(info, root: str, name: str, mode: tuple) -> dict:
    from pathlib import Path

    from fastvideo.training.checkpoint import save_checkpoint

    use_lora = mode[3]
    model, opt, ema = _build(info, mode)
    _train(info, model, opt, ema, steps=2)
    saved = {}
    for fmt in ("gathered", "sharded"):
        saved[fmt] = save_checkpoint(Path(root) / name / fmt, 2, model, opt, None, ema, extra_state={},
                                     trainable_only=use_lora, sharded=fmt == "sharded")
    model2, opt2, ema2 = _load(info, mode, saved["sharded"], use_lora)
    checks = {"resumes bit-exactly": _same(_state(model2, opt2, ema2), _state(model, opt, ema)) and
              ema2.num_updates == 2}
    checks["the step after the resume equals"] = all(
        torch.equal(a, b) for a, b in zip(_next_params(info, model2, opt2), _next_params(info, model, opt)))
    cross = {fmt: _state(*_load(info, CROSS[use_lora], saved[fmt], use_lora)) for fmt in saved}
    checks["re-sharded into another layout it loads as the gathered format"] = _same(cross["sharded"],
                                                                                    cross["gathered"])
    if use_lora and not mode[2]:  # the base outside FSDP: torch's state-dict API works here, a reference
        checks["the trainable gather equals torch's state-dict API"] = _trainable_gather_matches(model)
    files = sorted(p.name for p in (saved["sharded"] / "shards").iterdir())
    return {"checks": checks, "files": files, "wrapping": _wrapping(model)}


def _wrapping(model) -> str:
    strategy = getattr(model, "sharding_strategy", None)
    return strategy.name if strategy is not None else type(model).__name__


def _trainable_gather_matches(model) -> bool:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from fastvideo.distributed import fsdp

    ours = fsdp._gathered_trainable(model)
    theirs = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, ignore_frozen_params=True))
    theirs = {fsdp._clean_name(k): v for k, v in theirs.items() if "lora_" in k}
    return ours.keys() == theirs.keys() and len(ours) > 0 and all(torch.equal(ours[k], theirs[k]) for k in ours) \
        if torch.distributed.get_rank() == 0 else ours == {}


def _all_modes(info, root: str, modes: dict) -> dict:
    return {name: _check_mode(info, root, name, mode) for name, mode in modes.items()}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes")
    return root, run_distributed(_all_modes, str(root), MODES, world_size=2, timeout=400)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes4")
    return root, run_distributed(_all_modes, str(root), FOUR_RANK_MODE, world_size=4, timeout=300)


WRAPPING = {"hybrid_replicas": "NO_SHARD", "hybrid_zero2_one_node": "SHARD_GRAD_OP",
            "ddp": "DistributedDataParallel", "cpu_offload": "FULL_SHARD", "lora": "FULL_SHARD",
            "lora_cpu_offload": "FULL_SHARD", "hybrid_2x2": "HYBRID_SHARD"}


@pytest.mark.parametrize("name", list(MODES))
def test_sharded_checkpoint_resumes_and_reshards_on_two_ranks(two_ranks, name):
    _, ranks = two_ranks
    assert ranks[0][name]["wrapping"] == WRAPPING[name]  # the mode is what the test says it is
    for rank, result in enumerate(ranks):
        failed = [check for check, ok in result[name]["checks"].items() if not ok]
        assert not failed, f"{name}, rank {rank}: {failed}"


def test_hybrid_shard_on_four_ranks_resumes_and_reshards(four_ranks):
    _, ranks = four_ranks
    assert ranks[0]["hybrid_2x2"]["wrapping"] == WRAPPING["hybrid_2x2"]
    for rank, result in enumerate(ranks):
        failed = [check for check, ok in result["hybrid_2x2"]["checks"].items() if not ok]
        assert not failed, f"rank {rank}: {failed}"


ONE, TWO = ["rank-00000.safetensors"], ["rank-00000.safetensors", "rank-00001.safetensors"]
SHARD_FILES = {"hybrid_replicas": ONE,  # the replica (rank 1) writes nothing
               "ddp": ONE, "hybrid_zero2_one_node": TWO, "cpu_offload": TWO, "lora": TWO, "lora_cpu_offload": TWO}


@pytest.mark.parametrize("name", list(SHARD_FILES))
def test_replicas_write_no_shard_files_of_their_own(two_ranks, name):
    root, ranks = two_ranks
    expected = SHARD_FILES[name]
    assert ranks[0][name]["files"] == expected
    index = json.loads((root / name / "sharded" / "checkpoint-2" / "shards.json").read_text())
    assert [s["file"] for s in index["shards"]] == [f"shards/{f}" for f in expected]
    assert index["world_size"] == 2


def test_hybrid_shard_writes_one_file_per_shard_position(four_ranks):
    root, ranks = four_ranks
    # ranks 2 and 3 (the second node) hold the same slices as ranks 0 and 1
    assert ranks[0]["hybrid_2x2"]["files"] == ["rank-00000.safetensors", "rank-00001.safetensors"]
    index = json.loads((root / "hybrid_2x2" / "sharded" / "checkpoint-2" / "shards.json").read_text())
    assert index["world_size"] == 4 and [s["rank"] for s in index["shards"]] == [0, 1]


def _one_process(path, use_lora: bool):
    from fastvideo import devices
    from fastvideo.training import lora
    from fastvideo.training.checkpoint import load_checkpoint
    from fastvideo.training.ema import EMA

    model = tiny_transformer(seed=0 if use_lora else 5)  # LoRA: the base as built; else weights from the file
    if use_lora:
        lora.apply_lora(model, lora.LoraSettings(True, 4, 8.0, 0.0, LORA_TARGETS, None), torch.float32,
                        torch.float32, seed=7)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.5, **devices.adamw_kernel_kwargs("cpu"))
    ema = EMA(model, decay=0.5)
    load_checkpoint(path, model, opt, ema=ema, trainable_only=use_lora)
    return model, opt, ema


def _one_process_pairs(root, modes):
    for name, mode in modes.items():
        a = _one_process(root / name / "sharded" / "checkpoint-2", mode[3])
        b = _one_process(root / name / "gathered" / "checkpoint-2", mode[3])
        yield name, a, b


def _assert_same_one_process(name, a, b):
    (am, ao, ae), (bm, bo, be) = a, b
    for (pname, pa), pb in zip(am.named_parameters(), bm.parameters()):
        assert torch.equal(pa, pb), (name, pname)
        if pa.requires_grad:
            sa, sb = ao.state[pa], bo.state[pb]
            assert sa.keys() == sb.keys() == {"step", "exp_avg", "exp_avg_sq"}, (name, pname)
            assert all(torch.equal(sa[k], sb[k]) for k in sa), (name, pname)
    assert len(ae.shadow) == len(be.shadow) > 0 and all(torch.equal(x, y) for x, y in zip(ae.shadow, be.shadow))
    assert ae.num_updates == be.num_updates == 2


def test_one_process_resumes_every_modes_sharded_checkpoint_as_the_gathered_one(two_ranks, four_ranks):
    for root, modes in ((two_ranks[0], MODES), (four_ranks[0], FOUR_RANK_MODE)):
        for name, a, b in _one_process_pairs(root, modes):
            _assert_same_one_process(name, a, b)
            if modes[name][3]:  # LoRA: the adapters were trained (B starts at zero)
                assert any(torch.count_nonzero(p) for n, p in a[0].named_parameters() if "lora_B" in n)


@pytest.mark.parametrize("name", ["hybrid_replicas", "hybrid_zero2_one_node", "cpu_offload", "hybrid_2x2"])
def test_model_file_written_unit_by_unit_equals_the_gathered_one(two_ranks, four_ranks, name):
    from safetensors.torch import load_file

    root = four_ranks[0] if name in FOUR_RANK_MODE else two_ranks[0]
    a = load_file(str(root / name / "sharded" / "checkpoint-2" / "diffusion_pytorch_model.safetensors"))
    b = load_file(str(root / name / "gathered" / "checkpoint-2" / "diffusion_pytorch_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
