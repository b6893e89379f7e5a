"""The collective counter (fastvideo.distributed.comm_count) on 2 gloo ranks, and the FSDP cost
model's per-phase prediction (fastvideo.perf.comms.predicted_collectives) against it."""

from __future__ import annotations

import pytest
import torch

from dist_utils import run_distributed


def _count_body(info):
    import torch.distributed as dist

    from fastvideo.distributed import comm_count

    comm_count.install()
    comm_count.install()  # idempotent: no double counting
    comm_count.reset()
    w = info.world_size
    x = torch.arange(6, dtype=torch.float32)  # 24 bytes
    with comm_count.phase("rollout"):
        dist.all_reduce(x)
        dist.all_gather([torch.empty(6) for _ in range(w)], x)  # 48 bytes gathered
        dist.all_gather_into_tensor(torch.empty(6 * w), x)  # calls all_gather_single inside: counted once
        with comm_count.phase("decode"):
            dist.broadcast(x, src=0)
    with comm_count.phase("update"):
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(6, dtype=torch.bfloat16).float()[:3 * w])
        dist.all_to_all_single(torch.empty(4), torch.ones(4))
    dist.all_reduce(torch.ones(2, dtype=torch.int64))  # outside any phase: "other"
    first = comm_count.metrics()
    comm_count.reset()  # a new iteration: nothing of the last one is left
    with comm_count.phase("eval"):  # the counted tensors passed by keyword
        dist.all_gather(tensor_list=[torch.empty(6) for _ in range(w)], tensor=x)
        dist.reduce_scatter_tensor(output=torch.empty(3), input=torch.ones(3 * w))
    return first, comm_count.metrics()


def test_counter_counts_calls_and_bytes_by_phase():
    m, after_reset = run_distributed(_count_body, world_size=2)[0]
    assert m["comm/rollout/all_reduce_calls"] == 1 and m["comm/rollout/all_reduce_bytes"] == 24
    assert m["comm/rollout/all_gather_calls"] == 2 and m["comm/rollout/all_gather_bytes"] == 48 + 48
    assert m["comm/decode/broadcast_calls"] == 1 and m["comm/decode/broadcast_bytes"] == 24
    assert "comm/rollout/broadcast_calls" not in m  # the innermost phase has it
    assert m["comm/update/reduce_scatter_calls"] == 1 and m["comm/update/reduce_scatter_bytes"] == 24
    assert m["comm/update/all_to_all_calls"] == 1 and m["comm/update/all_to_all_bytes"] == 16
    assert m["comm/other/all_reduce_calls"] == 1 and m["comm/other/all_reduce_bytes"] == 16
    assert m["comm/total/all_reduce_calls"] == 2 and m["comm/total/all_gather_bytes"] == 96
    assert after_reset == {"comm/eval/all_gather_calls": 1, "comm/eval/all_gather_bytes": 48,
                           "comm/eval/reduce_scatter_calls": 1, "comm/eval/reduce_scatter_bytes": 24,
                           "comm/total/all_gather_calls": 1, "comm/total/all_gather_bytes": 48,
                           "comm/total/reduce_scatter_calls": 1, "comm/total/reduce_scatter_bytes": 24}
