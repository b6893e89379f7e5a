"""Peak bytes of the tensors a computation keeps alive, simulated on the meta device (no memory, no
arithmetic): every tensor an operator creates is counted from its creation until the last tensor
sharing its storage dies. Inputs and parameters that exist before the measurement are not counted.

    tracker = LiveBytes()
    with tracker:
        loss = model(**meta_inputs).sum()
        loss.backward()
    tracker.peak   # bytes

This is what the caching allocator of a device would have to hold at once, before fragmentation.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, int] = {}  # storage key -> live tensors on it
        self.size: dict[int, int] = {}  # storage key -> bytes
        self.current = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.current -= self.size.pop(key)
            del self.refs[key]

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self.refs:
            self.refs[key] = 0
            self.size[key] = storage.nbytes()
            self.current += self.size[key]
            self.peak = max(self.peak, self.current)
        self.refs[key] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            # An in-place op returns its input: already counted (or pre-existing).
            if isinstance(t, torch.Tensor) and id(t) not in inputs:
                self._track(t)
        return out
