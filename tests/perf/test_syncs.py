"""Every kind the sync counter (fastvideo.perf.syncs) claims to count is counted, once per operation,
under its own name; what does not synchronise is not counted."""

from __future__ import annotations

import pytest
import torch

from fastvideo.perf.syncs import COPY_KINDS, SYNC_KINDS, SyncCounter, dispatch_kind

aten = torch.ops.aten


def _fastvideo_code(source: str):
    """``source`` compiled as if it were a fastvideo module's line (the counter counts only the
    host-to-device moves fastvideo makes itself)."""
    code = compile(source, "/src/fastvideo/some_module.py", "exec")
    return lambda **names: exec(code, {"torch": torch}, names)


T, MASK = torch.arange(6.0), torch.tensor([True, False, True, False, True, False])
IDX = torch.tensor([0, 2, 2, 1])
# (kind, operation, how many of that kind it makes): one row per way the docstring names
CASES = [
    ("item", lambda: T[1].item(), 1),
    ("item", lambda: float(T[2]) + int(T[3]), 2),
    ("item", lambda: bool(T[1] > 0), 1),
    ("item", lambda: 1 if T[1] else 0, 1),
    ("tolist", lambda: T.tolist(), 1),  # its per-element reads are not counted again
    ("tolist", lambda: T.numpy(), 1),
    ("print", lambda: repr(T), 1),
    ("print", lambda: str(T[0]), 1),
    ("print", lambda: f"{T[0]:.2f}", 1),
    ("nonzero", lambda: torch.nonzero(T), 1),
    ("nonzero", lambda: torch.where(MASK), 1),
    ("nonzero", lambda: torch.argwhere(T), 1),
    ("mask_index", lambda: T[MASK], 1),
    ("mask_index", lambda: T.clone().__setitem__(MASK, T[:3]), 1),
    ("mask_index", lambda: torch.masked_select(T, MASK), 1),
    ("unique", lambda: torch.unique(IDX), 1),
    ("unique", lambda: torch.unique_consecutive(IDX), 1),
    ("data_size", lambda: torch.repeat_interleave(T[:4], IDX), 1),
    ("data_size", lambda: torch.bincount(IDX), 1),
    ("data_size", lambda: torch.histc(T, bins=3), 1),
    ("equal", lambda: torch.equal(T, T), 1),
    ("host_data", lambda: torch.tensor([1.0, 2.0]), 1),
    ("host_data", lambda: torch.as_tensor([3, 4]), 1),
    ("to_device", lambda: _fastvideo_code("t.to('cpu')")(t=T), 1),
    ("to_device", lambda: _fastvideo_code("t.to(device=torch.device('cpu'))")(t=T), 1),
]


@pytest.mark.parametrize("kind, operation, n", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_kind_is_counted(kind, operation, n):
    """Issue #39 test 26."""
    with SyncCounter() as counter:
        operation()
    kinds = {k: c for k in (*SYNC_KINDS, *COPY_KINDS) if (c := counter.total((k,)))}
    assert kinds == {kind: n}, counter.report()


def test_every_kind_has_a_case():
    assert {c[0] for c in CASES} | {"to_host"} == set(SYNC_KINDS) | set(COPY_KINDS)


@pytest.mark.parametrize("operation", [
    lambda: T * 2 + 1, lambda: T[IDX], lambda: torch.repeat_interleave(T[:4], IDX, output_size=5),
    lambda: T.to("cpu"),  # the test's own move (not fastvideo's)
    lambda: _fastvideo_code("t.to(torch.float64)")(t=T),  # a dtype change is no move
    lambda: T.sum(), lambda: torch.where(MASK, T, 0.0),
])
def test_what_does_not_synchronise_is_not_counted(operation):
    with SyncCounter() as counter:
        operation()
    assert counter.total() == 0 and counter.total(COPY_KINDS) == 0, counter.report()


def test_a_copy_to_the_host_is_counted_from_a_device_tensor():
    """to_host is only visible on an accelerator: the decision itself, on a meta tensor as the device's."""
    on_device, host = torch.empty(3, device="meta"), torch.empty(3)
    assert dispatch_kind(aten._to_copy.default, (on_device,), {"device": torch.device("cpu")}) == "to_host"
    assert dispatch_kind(aten.copy_.default, (host, on_device), {}) == "to_host"
    assert dispatch_kind(aten._to_copy.default, (host,), {"device": torch.device("cpu")}) is None
    assert dispatch_kind(aten._to_copy.default, (on_device,), {"dtype": torch.float16}) is None
    assert dispatch_kind(aten.copy_.default, (on_device, host), {}) is None  # host to device
