"""The HCCL-rules switch of the test harness (tests/hccl_rules.py) rejects what HCCL rejects."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from dist_utils import run_distributed

import hccl_rules


def _float64_all_reduce(info):
    import torch.distributed as dist

    t = torch.full((2,), float(info.rank + 1), dtype=torch.float64)
    dist.all_reduce(t)
    return t


def test_switch_rejects_a_float64_all_reduce():
    with pytest.raises(AssertionError, match="HCCL allreduce: Unsupported data type at::kDouble"):
        run_distributed(_float64_all_reduce, env={"FLUX_GRPO_HCCL_RULES": "1"})


def test_gloo_alone_accepts_it():
    """Why the switch exists: without it the same call passes on gloo."""
    out = run_distributed(_float64_all_reduce, env={"FLUX_GRPO_HCCL_RULES": "0"})
    assert out[0].tolist() == [3.0, 3.0]


def _metrics_and_objects(info):
    import torch.distributed as dist

    from fastvideo.training.metrics import reduce_scalars

    mean = reduce_scalars({"loss": 1.0 + info.rank, "steps": 2 * info.rank, "t": torch.tensor(0.5 * info.rank)},
                          info.device, "mean")
    top = reduce_scalars({"mem": 3.0 - info.rank}, info.device, "max")
    box = [{"rank": info.rank}] if info.rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    gathered = [None, None]
    dist.all_gather_object(gathered, info.rank * 10)
    dist.barrier()
    return {"mean": mean, "max": top, "box": box[0]["rank"], "gathered": gathered,
            "calls": dict(hccl_rules.calls)}


def test_metrics_and_object_collectives_pass_under_the_rules():
    out = run_distributed(_metrics_and_objects, env={"FLUX_GRPO_HCCL_RULES": "1"})
    for r in out:
        assert r["mean"] == {"loss": 1.5, "steps": 1.0, "t": 0.25}
        assert r["max"] == {"mem": 3.0}
        assert r["box"] == 0 and r["gathered"] == [0, 10]
        # the object collectives went through the checked tensor collectives
        assert r["calls"]["all_reduce"] >= 2 and r["calls"]["broadcast"] >= 2 and r["calls"]["all_gather"] >= 1


def _gather_into_tensor(info):
    import torch.distributed as dist

    out = torch.empty(info.world_size, dtype=torch.float32)
    dist.all_gather_into_tensor(out, torch.tensor([float(info.rank)]))
    return out


def test_tensor_collectives_refuse_world_size_3():
    assert run_distributed(_gather_into_tensor, world_size=2)[0].tolist() == [0.0, 1.0]
    with pytest.raises(AssertionError, match="world size 3 is not supported"):
        run_distributed(_gather_into_tensor, world_size=3)


def _single_collectives(info, dtype, world_check):
    import torch.distributed as dist

    w = info.world_size
    if world_check:  # all_gather_single: the world-size rule (gloo itself would accept 3 ranks)
        out = torch.empty(w, dtype=dtype)
        dist.all_gather_single(out, torch.tensor([float(info.rank)], dtype=dtype))
        return out.float()
    out = torch.empty(2, dtype=dtype)
    dist.reduce_scatter_single(out, torch.ones(2 * w, dtype=dtype))  # FSDP's gradient reduce-scatter
    return out.float()


@pytest.mark.skipif(not hasattr(torch.distributed, "reduce_scatter_single"), reason="torch < 2.10")
def test_single_collectives_fsdp_calls_are_checked():
    """FSDP1 (torch >= 2.10) calls reduce_scatter_single / all_gather_single directly: the dtype and
    world-size rules apply to them as to the *_tensor names."""
    assert run_distributed(_single_collectives, torch.float32, False)[0].tolist() == [2.0, 2.0]
    with pytest.raises(AssertionError, match="HCCL _reduce_scatter_base: Unsupported data type at::kDouble"):
        run_distributed(_single_collectives, torch.float64, False)
    assert run_distributed(_single_collectives, torch.float32, True)[1].tolist() == [0.0, 1.0]
    with pytest.raises(AssertionError, match="_allgather_base: world size 3 is not supported"):
        run_distributed(_single_collectives, torch.float32, True, world_size=3)


@pytest.mark.parametrize("dtype,name,reduces,ok", [
    (torch.float32, "allreduce", True, True), (torch.bfloat16, "allreduce", True, True),
    (torch.int64, "allreduce", True, True), (torch.float64, "allreduce", True, False),
    (torch.bool, "allreduce", True, False), (torch.uint8, "reduce_scatter", True, False),
    (torch.float64, "broadcast", False, True), (torch.uint8, "allgather", False, True),
    (torch.complex64, "broadcast", False, False),
])
def test_dtype_table(dtype, name, reduces, ok):
    t = torch.zeros(2, dtype=dtype)
    if ok:
        hccl_rules.check_tensor(t, name, reduces)
    else:
        with pytest.raises(hccl_rules.HcclRuleError, match="Unsupported data type"):
            hccl_rules.check_tensor(t, name, reduces)


def test_ops_layout_and_device(monkeypatch):
    import torch.distributed as dist

    hccl_rules.check_op(dist.ReduceOp.AVG, "allreduce")  # HCCL sums then divides
    with pytest.raises(hccl_rules.HcclRuleError, match="Cannot use ReduceOp.BAND with HCCL"):
        hccl_rules.check_op(dist.ReduceOp.BAND, "allreduce")
    with pytest.raises(hccl_rules.HcclRuleError, match="Tensors must be contiguous"):
        hccl_rules.check_tensor(torch.zeros(3, 4).t(), "allreduce", True)
    # A process bound to accelerator 1 (cuda stands in: torch without torch_npu has no "npu" device).
    monkeypatch.setenv("FASTVIDEO_DEVICE", "cuda")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(hccl_rules.HcclRuleError, match="Tensors must be NPU and dense.*cuda:1"):
        hccl_rules.check_tensor(torch.zeros(2), "allreduce", True)


def test_torchrun_children_get_the_rules():
    """tests/hccl_site on PYTHONPATH (set by conftest) installs the rules at interpreter start."""
    code = "import torch.distributed as d; print(getattr(d.all_reduce, '__hccl_rules__', False))"
    env = dict(os.environ, FLUX_GRPO_HCCL_RULES="1")
    assert os.path.join("tests", "hccl_site") in env["PYTHONPATH"]
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    off = subprocess.run([sys.executable, "-c", code], env={**env, "FLUX_GRPO_HCCL_RULES": "0"},
                         capture_output=True, text=True, check=True)
    assert on.stdout.strip() == "True" and off.stdout.strip() == "False"
