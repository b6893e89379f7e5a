"""Collective counter: calls and bytes of every ``torch.distributed`` collective, by kind and phase.

    comm_count.install()                  # once per process (idempotent); stays on
    comm_count.reset()                    # at an iteration's start
    with comm_count.phase("rollout"): ... # the trainer's PhaseTimer enters this for every phase
    record.update(comm_count.metrics())   # {"comm/rollout/all_gather_calls": 16, ...}

Kinds: all_gather (all_gather, all_gather_into_tensor, _all_gather_base, all_gather_single),
reduce_scatter (reduce_scatter, reduce_scatter_tensor, _reduce_scatter_base, reduce_scatter_single),
all_reduce, broadcast, all_to_all (all_to_all, all_to_all_single). Object collectives
(all_gather_object, broadcast_object_list ...) are counted through the tensor collectives they
issue. FSDP1 calls these by their module names at run time (``dist.all_gather`` on the CPU,
``dist.all_gather_single`` on an accelerator, ``dist.reduce_scatter_single`` for gradients), so
wrapping the names in ``torch.distributed`` and ``distributed_c10d`` sees them all.

Bytes are the collective's whole tensor on this rank: the gathered output of an all-gather, the
unreduced input of a reduce-scatter, the tensor of an all-reduce or broadcast, the input of an
all-to-all. A ring moves (W - 1) / W of that into each rank (fastvideo.perf.comms models that).

Nested calls (torch 2.14's all_gather_into_tensor calls all_gather_single) count once: only the
outermost wrapped call of a thread counts. Cost per call: a dict update and a numel per tensor.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Iterator

import torch

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all")
# (kind, the argument whose tensors are counted) -> the torch.distributed functions of that kind
_BY_KIND = {
    ("all_gather", 0): ("all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_single"),
    ("reduce_scatter", 1): ("reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single"),
    ("all_reduce", 0): ("all_reduce",),
    ("broadcast", 0): ("broadcast",),
    ("all_to_all", 1): ("all_to_all", "all_to_all_single"),
}
# torch.distributed name -> (kind, the argument whose tensors are counted)
FUNCTIONS = {name: kind for kind, names in _BY_KIND.items() for name in names}
OUTSIDE = "other"  # collectives outside any named phase (the metrics' own reductions)
TOTAL = "total"

_counts: dict[tuple[str, str], list[int]] = {}  # (phase, kind) -> [calls, bytes]
_phases: list[str] = [OUTSIDE]
_local = threading.local()


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _wrap(name: str, fn):
    kind, index = FUNCTIONS[name]
    arg_name = list(inspect.signature(fn).parameters)[index]

    @functools.wraps(fn)
    def counted(*args, **kwargs):
        if getattr(_local, "depth", 0) or torch.compiler.is_compiling():
            # inside another counted collective: counted there; in a graph Dynamo captures: not counted
            return fn(*args, **kwargs)
        value = args[index] if len(args) > index else kwargs.get(arg_name)
        entry = _counts.setdefault((_phases[-1], kind), [0, 0])
        entry[0] += 1
        entry[1] += _nbytes(value)
        _local.depth = 1
        try:
            return fn(*args, **kwargs)
        finally:
            _local.depth = 0

    counted.__comm_count__ = True
    return counted


def install() -> None:
    """Wrap every collective of FUNCTIONS this torch has, in both namespaces (idempotent; it wraps
    whatever is there, e.g. the tests' HCCL rule checks)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in FUNCTIONS:
        current = getattr(c10d, name, None)
        if current is None or getattr(current, "__comm_count__", False):
            continue
        wrapped = _wrap(name, current)
        setattr(c10d, name, wrapped)
        if hasattr(dist, name):
            setattr(dist, name, wrapped)


def installed() -> bool:
    import torch.distributed.distributed_c10d as c10d

    return getattr(getattr(c10d, "all_reduce", None), "__comm_count__", False)


def reset() -> None:
    _counts.clear()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Attribute the collectives inside to ``name`` (nested phases: the innermost)."""
    _phases.append(name)
    try:
        yield
    finally:
        _phases.pop()


def counts() -> dict[str, dict[str, tuple[int, int]]]:
    """{phase: {kind: (calls, bytes)}} since the last reset, with a TOTAL phase summing them."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    total: dict[str, list[int]] = {}
    for (ph, kind), (calls, nbytes) in sorted(_counts.items()):
        out.setdefault(ph, {})[kind] = (calls, nbytes)
        t = total.setdefault(kind, [0, 0])
        t[0] += calls
        t[1] += nbytes
    out[TOTAL] = {k: (v[0], v[1]) for k, v in total.items()}
    return out


def metrics() -> dict[str, int]:
    """Flat metrics of counts(): comm/<phase>/<kind>_calls and _bytes (kinds that ran only)."""
    flat = {}
    for ph, kinds in counts().items():
        for kind, (calls, nbytes) in kinds.items():
            flat[f"comm/{ph}/{kind}_calls"] = calls
            flat[f"comm/{ph}/{kind}_bytes"] = nbytes
    return flat
