"""A torch dispatch mode that fails on float64 / complex work on tensors that would live on the
accelerator.

On an NPU, ``.double()`` / ``.to(torch.float64)`` silently give float32 and many kernels
(repeat_interleave among them) have no float64 at all; complex dtypes are no better. CPU tests
cannot see that, so this mode treats EVERY tensor op as device work and fails on any op whose
inputs or outputs are float64 or complex -- except inside the functions listed in ``CPU_ONLY``,
which work on CPU data on purpose (their code objects are looked up on the Python stack).

Keep ``CPU_ONLY`` short: each entry is a claim, checked by reading the function, that its tensors
never reach the device.
"""

from __future__ import annotations

import sys
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

WIDE = frozenset({torch.float64, torch.complex32, torch.complex64, torch.complex128})


class Float64OnDevice(AssertionError):
    pass


def _wide_dtypes(values) -> set[torch.dtype]:
    flat, _ = tree_flatten(values)
    found = {v.dtype for v in flat if isinstance(v, torch.Tensor) and v.dtype in WIDE}
    found |= {v for v in flat if isinstance(v, torch.dtype) and v in WIDE}
    return found


class NoFloat64OnDevice(TorchDispatchMode):
    """``with NoFloat64OnDevice(cpu_only=[fn, ...]):`` raises Float64OnDevice at the first float64 or
    complex op issued outside the listed functions. ``ops`` counts the ops seen (proof it ran)."""

    def __init__(self, cpu_only: Iterable = ()):
        super().__init__()
        self.cpu_only = {getattr(fn, "__code__", fn) for fn in cpu_only}
        self.ops = 0

    def _in_cpu_only_code(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code in self.cpu_only:
                return True
            frame = frame.f_back
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        wide = _wide_dtypes((args, kwargs)) | _wide_dtypes(out)
        if wide and not self._in_cpu_only_code():
            raise Float64OnDevice(f"{func} works in {sorted(map(str, wide))} on a tensor that would live on the "
                                  "accelerator (no float64/complex there)")
        return out
