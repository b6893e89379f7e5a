"""--checkpoint_format sharded (fastvideo/training/checkpoint/shards.py): 2 FSDP ranks write their
own optimizer / EMA shards and the model file unit by unit; the checkpoint resumes bit-exactly on
2 ranks and on 1 process (plain parameters), its model file equals the gathered format's and
loads with diffusers' from_pretrained, and COMPLETE.json's digests cover the shards.

One 2-rank run writes both formats from the same state (the gathered one is the reference); the
1-process loads happen in the test process."""

from __future__ import annotations

import json

import pytest
import torch
from dist_utils import loss_fn, run_distributed, tiny_inputs, tiny_transformer


def _trained(info, steps: int = 2):
    """The tiny transformer (FSDP full shard on 2 ranks, plain on 1), fused AdamW and an EMA after
    ``steps`` optimizer steps on rank-dependent inputs."""
    from fastvideo import devices
    from fastvideo.distributed import fsdp
    from fastvideo.training.ema import EMA

    model = fsdp.wrap_model(tiny_transformer(), "full", info.device)
    opt = torch.optim.AdamW(fsdp.trainable_parameters(model), lr=1e-3, weight_decay=1e-4,
                            **devices.adamw_kernel_kwargs(info.device))
    ema = EMA(model, decay=0.9)
    for step in range(steps):
        loss_fn(model, tiny_inputs(info.rank + 10 * step)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(model)
    return model, opt, ema


def _state(model, opt, ema) -> dict:
    params = [p.detach().clone() for p in model.parameters()]
    return {"params": params, "shadow": [s.clone() for s in ema.shadow],
            "opt": [{k: v.clone() for k, v in sorted(opt.state[p].items())} for p in model.parameters()]}


def _step(model, opt, rank) -> list[torch.Tensor]:
    loss_fn(model, tiny_inputs(rank + 99)).backward()
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _write_and_resume(info, root):
    from pathlib import Path

    from fastvideo.training.checkpoint import load_checkpoint, save_checkpoint

    model, opt, ema = _trained(info)
    for fmt in ("gathered", "sharded"):
        save_checkpoint(Path(root) / fmt, 2, model, opt, None, ema, extra_state={}, sharded=fmt == "sharded")
    model2, opt2, ema2 = _trained(info, steps=0)
    load_checkpoint(Path(root) / "sharded" / "checkpoint-2", model2, opt2, ema=ema2)
    return {"saved": _state(model, opt, ema), "loaded": _state(model2, opt2, ema2), "num_updates": ema2.num_updates,
            "next": _step(model, opt, info.rank), "next_loaded": _step(model2, opt2, info.rank)}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    return root, run_distributed(_write_and_resume, str(root), world_size=2, timeout=300)


def _equal_lists(a, b):
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_two_ranks_resume_their_own_sharded_checkpoint_bit_exactly(written):
    _, ranks = written
    for r in ranks:
        _equal_lists(r["loaded"]["params"], r["saved"]["params"])
        _equal_lists(r["loaded"]["shadow"], r["saved"]["shadow"])
        for a, b in zip(r["loaded"]["opt"], r["saved"]["opt"]):
            assert a.keys() == b.keys() == {"step", "exp_avg", "exp_avg_sq"}
            assert all(torch.equal(a[k], b[k]) for k in a)
        assert r["num_updates"] == 2
        _equal_lists(r["next_loaded"], r["next"])  # the step after the resume too


def _plain_load(path, sharded_expected):
    from fastvideo.training.checkpoint import shards as checkpoint_shards
    from fastvideo.training.checkpoint import load_checkpoint

    assert checkpoint_shards.is_sharded(path) is sharded_expected
    from dist_utils import tiny_transformer as build

    from fastvideo import devices
    from fastvideo.training.ema import EMA

    model = build(seed=5)  # other weights: everything must come from the checkpoint
    opt = torch.optim.AdamW(list(model.parameters()), lr=0.5, **devices.adamw_kernel_kwargs("cpu"))
    ema = EMA(model, decay=0.5)
    load_checkpoint(path, model, opt, ema=ema)
    return model, opt, ema


def test_one_process_resumes_a_two_rank_sharded_checkpoint_as_the_gathered_one(written):
    root, _ = written
    a_model, a_opt, a_ema = _plain_load(root / "sharded" / "checkpoint-2", True)
    b_model, b_opt, b_ema = _plain_load(root / "gathered" / "checkpoint-2", False)
    for (name, pa), pb in zip(a_model.named_parameters(), b_model.parameters()):
        assert torch.equal(pa, pb), name
        sa, sb = a_opt.state[pa], b_opt.state[pb]
        assert sa.keys() == sb.keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        assert all(torch.equal(sa[k], sb[k]) and sa[k].device == sb[k].device for k in sa), name
    assert a_opt.param_groups[0]["lr"] == b_opt.param_groups[0]["lr"] == 1e-3
    assert a_opt.param_groups[0]["betas"] == b_opt.param_groups[0]["betas"] == (0.9, 0.999)
    _equal_lists(a_ema.shadow, b_ema.shadow)
    assert a_ema.num_updates == b_ema.num_updates == 2


def test_one_process_holds_the_two_ranks_slices_joined(written):
    """The 1-process resume against the 2 ranks' own state, not through any loader: each
    parameter's weights, AdamW moments and EMA, concatenated in the flat parameter's order, are
    the two ranks' flat shards joined (FSDP's padding at the end dropped)."""
    root, ranks = written
    path = root / "sharded" / "checkpoint-2"
    index = json.loads((path / "shards.json").read_text())
    model, opt, ema = _plain_load(path, True)
    params = dict(model.named_parameters())
    shadow = {id(p): s for p, s in zip(model.parameters(), ema.shadow)}
    assert len(index["tensors"]) == len(ranks[0]["saved"]["params"]) > 1
    for i, t in enumerate(index["tensors"]):
        mine = [params[n] for n in t["names"]]
        cases = {"params": (lambda r: r["saved"]["params"][i], mine),
                 "shadow": (lambda r: r["saved"]["shadow"][i], [shadow[id(p)] for p in mine])}
        for key in ("exp_avg", "exp_avg_sq"):
            cases[key] = (lambda r, key=key: r["saved"]["opt"][i][key], [opt.state[p][key] for p in mine])
        for what, (slice_of, tensors) in cases.items():
            ours = torch.cat([x.detach().reshape(-1) for x in tensors])
            joined = torch.cat([slice_of(r).reshape(-1) for r in ranks])
            assert torch.equal(joined[:ours.numel()], ours), (what, t["names"][0])


def test_model_file_equals_the_gathered_one_and_loads_with_from_pretrained(written):
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import load_file

    root, _ = written
    sharded, gathered = root / "sharded" / "checkpoint-2", root / "gathered" / "checkpoint-2"
    a = load_file(str(sharded / "diffusion_pytorch_model.safetensors"))
    b = load_file(str(gathered / "diffusion_pytorch_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    model = FluxTransformer2DModel.from_pretrained(str(sharded))
    assert all(torch.equal(v, a[k]) for k, v in model.state_dict().items())
    marker = json.loads((sharded / "COMPLETE.json").read_text())
    assert {"shards/rank-00000.safetensors", "shards/rank-00001.safetensors", "shards.json"} <= set(marker["sha256"])
    assert not (sharded / "optimizer.json").exists() and not (sharded / "ema.safetensors").exists()


def test_a_damaged_shard_is_found_before_loading(written, tmp_path):
    import shutil

    from fastvideo.training.checkpoint import CheckpointError, load_checkpoint

    root, _ = written
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(root / "sharded" / "checkpoint-2", copy)
    shard = copy / "shards" / "rank-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="rank-00001.safetensors"):
        load_checkpoint(copy, tiny_transformer())


def test_ema_export_of_a_sharded_checkpoint_equals_the_gathered_ones(written, tmp_path):
    from safetensors.torch import load_file

    from fastvideo.training.export import export_checkpoint

    root, _ = written
    out = {}
    for fmt in ("sharded", "gathered"):
        folder = export_checkpoint(root / fmt / "checkpoint-2", tmp_path / fmt, ema=True)
        out[fmt] = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    a, b = out["sharded"], out["gathered"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    model = load_file(str(root / "sharded" / "checkpoint-2" / "diffusion_pytorch_model.safetensors"))
    assert any(not torch.equal(a[k], model[k]) for k in a)  # the EMA, not the weights


def test_one_process_writes_and_resumes_its_own_shard(tmp_path):
    """Without FSDP (one process, plain parameters) the sharded format is one shard of whole tensors."""
    from types import SimpleNamespace

    from fastvideo.training.checkpoint import load_checkpoint, save_checkpoint

    info = SimpleNamespace(rank=0, device=torch.device("cpu"))
    model, opt, ema = _trained(info, steps=1)
    path = save_checkpoint(tmp_path, 1, model, opt, None, ema, extra_state={}, sharded=True)
    assert sorted(p.name for p in (path / "shards").iterdir()) == ["rank-00000.safetensors"]
    model2, opt2, ema2 = _trained(SimpleNamespace(rank=1, device=torch.device("cpu")), steps=1)  # other state
    load_checkpoint(path, model2, opt2, ema=ema2)
    saved, loaded = _state(model, opt, ema), _state(model2, opt2, ema2)
    _equal_lists(loaded["params"], saved["params"])
    _equal_lists(loaded["shadow"], saved["shadow"])
    for a, b in zip(loaded["opt"], saved["opt"]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
