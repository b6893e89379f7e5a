"""The update's index tensors on the device, copied once per iteration (issue #37, item 4).

The update loop's terms index the trajectory at every step (rows, steps: int64 host tensors that
also index host data, e.g. the sample ids). Instead of one host-to-device copy per use and step
(22 in the tiny run's 2 terms), training/update.py copies all its terms' indices in one copy:

    with index_copies(tensors, device):   # one torch.cat and one copy
        ... on(rows, x.device)            # the copied view where it is on that device, else rows.to(...)

Outside the context (a reference loop, the rollout) on() is rows.to(device).
"""

from __future__ import annotations

import contextlib

import torch

from fastvideo import devices

_active: "IndexCopies | None" = None


def _same(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class IndexCopies:
    def __init__(self, tensors, device):
        self.device = torch.device(device)
        unique = {id(t): t for t in tensors if t is not None and t.dtype == torch.int64 and t.device.type == "cpu"}
        self._sources = list(unique.values())  # held, so that their ids stay theirs while the copies live
        self._views: dict[int, torch.Tensor] = {}
        if not self._sources:
            return
        moved = devices.to_device(torch.cat([t.reshape(-1) for t in self._sources]), self.device)
        offset = 0
        for t in self._sources:
            self._views[id(t)] = moved[offset:offset + t.numel()].view(t.shape)
            offset += t.numel()

    def get(self, t: torch.Tensor, device) -> torch.Tensor | None:
        view = self._views.get(id(t))
        return view if view is not None and _same(torch.device(device), self.device) else None


@contextlib.contextmanager
def index_copies(tensors, device):
    """While active, on(t, device) returns t's copy made here (one copy for all of ``tensors``)."""
    global _active
    previous, _active = _active, IndexCopies(tensors, device)
    try:
        yield _active
    finally:
        _active = previous


def on(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device``: the copy index_copies made, else ``t.to(device)``."""
    view = _active.get(t, device) if _active is not None else None
    return view if view is not None else t.to(device)
