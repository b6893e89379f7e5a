"""A counter of host-device synchronisations (and host-to-device copies), per phase of an iteration.

On an accelerator every device-to-host synchronisation drains the device's queue: the host waits
for all queued kernels before it can read a value back (on Ascend it also drains the task queue,
TASK_QUEUE_ENABLE). One per denoising step costs more than the step's element-wise work. On the
CPU nothing waits, so the counter counts the operations that WOULD synchronise, by kind:

  sync kinds (device -> host, blocking)
    item        aten._local_scalar_dense: .item(), float(t), int(t), bool(t), `if t:`, print of a 0-d tensor
    tolist      Tensor.tolist() / Tensor.numpy() (not dispatched: seen by the torch-function mode)
    print       repr / str / format of a tensor
    nonzero     aten.nonzero, torch.where(cond), argwhere (output size depends on the data)
    mask_index  indexing / index_put with a boolean mask (x[mask], x[mask] = v), aten.masked_select
    unique      aten.unique / _unique2 / unique_dim / unique_consecutive
    data_size   other ops whose output size is read from the data: repeat_interleave(Tensor) without
                output_size, bincount, histc
    equal       aten.equal (returns a host bool)
    to_host     a copy of a non-CPU tensor to the CPU (.cpu(), .to("cpu"), copy_ into a CPU tensor);
                only visible when the run really is on an accelerator
  copy kinds (host -> device; asynchronous on CUDA from pageable memory, blocking on Ascend)
    to_device   Tensor.to(device) of a CPU tensor with an explicit device argument, called from fastvideo
                code (on a CPU run the target is the CPU: counted as the copy it would be on the
                accelerator; a move of a tensor that already lives there is counted too)
    host_data   torch.tensor / torch.as_tensor of Python data (aten.lift_fresh): made on the host,
                copied to the device

Each event is labelled with a phase from the Python stack: the innermost frame that matches
PHASE_RULES names it, and a rule with ``loop=True`` only gives its loop phase while the frame is
inside the function's first ``for`` statement (found from the source once), so a sync placed
before or after a loop is per chunk / per iteration, one inside it per step. Events also carry
their site (the innermost fastvideo frame: file:line function), so a budget can list them by name.

    with SyncCounter() as counter:
        trainer.run_iteration()
    counter.counts()            # {(phase, kind): n}
    counter.report()            # a table, sites included
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

SYNC_KINDS = ("item", "tolist", "print", "nonzero", "mask_index", "unique", "data_size", "equal", "to_host")
COPY_KINDS = ("to_device", "host_data")

_DISPATCH_SYNCS = {
    aten._local_scalar_dense.default: "item",
    aten.nonzero.default: "nonzero",
    aten.masked_select.default: "mask_index",
    aten.equal.default: "equal",
    aten.bincount.default: "data_size",
    aten.histc.default: "data_size",
    aten.lift_fresh.default: "host_data",
}
for _name in ("unique", "_unique", "_unique2", "unique_dim", "unique_consecutive"):
    for _overload in getattr(aten, _name, None) or ():
        _DISPATCH_SYNCS[getattr(getattr(aten, _name), _overload)] = "unique"
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


@dataclass(frozen=True)
class PhaseRule:
    """Frames of function ``func`` in a file whose path ends with ``path`` are phase ``phase``; with
    ``loop`` only while inside the function's first for-loop (``phase`` names the loop; outside it the
    frame is ``outside``)."""

    path: str
    func: str
    phase: str
    loop: bool = False
    outside: str = ""


# Innermost match wins. The step loops must stay free of syncs; the others are per chunk, per
# optimizer step or per iteration.
PHASE_RULES = (
    PhaseRule("fastvideo/sampling/rollout.py", "sample_transitions", "rollout_step", loop=True,
              outside="rollout_chunk"),
    PhaseRule("fastvideo/sampling/rollout.py", "rollout", "rollout"),
    PhaseRule("fastvideo/sampling/rollout.py", "decode_images", "decode"),
    PhaseRule("fastvideo/training/update.py", "optimizer_step", "optimizer_step"),
    PhaseRule("fastvideo/training/update.py", "run", "update_step", loop=True, outside="update"),
)
STEP_PHASES = ("rollout_step", "update_step")


@lru_cache(maxsize=None)
def _loop_lines(code) -> tuple[int, int] | None:
    """(first, last) source line of the first for-loop of a function's code object, or None."""
    try:
        lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            return node.lineno + start - 1, node.end_lineno + start - 1
    return None


def _rule_phase(frame) -> str | None:
    path = frame.f_code.co_filename.replace("\\", "/")
    for rule in PHASE_RULES:
        if frame.f_code.co_name == rule.func and path.endswith(rule.path):
            if not rule.loop:
                return rule.phase
            span = _loop_lines(frame.f_code)
            inside = span is not None and span[0] <= frame.f_lineno <= span[1]
            return rule.phase if inside else rule.outside
    return None


def locate(frame=None) -> tuple[str, str]:
    """(phase, site) of the calling code: the innermost PHASE_RULES match (else "iteration") and the
    innermost fastvideo frame as "fastvideo/...py:LINE function" (else "-")."""
    frame = frame or sys._getframe(1)
    phase, site = None, None
    while frame is not None and phase is None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if site is None and "/fastvideo/" in path and not path.endswith("fastvideo/perf/syncs.py"):
            site = f"fastvideo/{path.rsplit('/fastvideo/', 1)[1]}:{frame.f_lineno} {frame.f_code.co_name}"
        phase = _rule_phase(frame)
        frame = frame.f_back
    return phase or "iteration", site or "-"


def _has_bool_index(func, args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()) if i is not None)


def dispatch_kind(func, args, kwargs) -> str | None:
    """The sync / copy kind of one dispatched aten call, or None."""
    kind = _DISPATCH_SYNCS.get(func)
    if kind is not None:
        return kind
    if func in _INDEX_OPS:
        return "mask_index" if _has_bool_index(func, args) else None
    if func is aten.repeat_interleave.Tensor:
        return "data_size" if kwargs.get("output_size") is None else None
    if func in (aten._to_copy.default, aten.copy_.default):
        src = args[1] if func is aten.copy_.default else args[0]
        dst_device = args[0].device if func is aten.copy_.default else kwargs.get("device")
        if isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst_device is not None \
                and torch.device(dst_device).type == "cpu":
            return "to_host"
    return None


def _to_device_arg(args, kwargs):
    """The device a Tensor.to call names (positional device / string, or device=), else None."""
    target = kwargs.get("device")
    for a in args[1:]:
        if isinstance(a, (torch.device, str)):
            target = a
    return target


class SyncCounter:
    """Counts SYNC_KINDS and COPY_KINDS events while active (this thread only: a reward scored on a
    worker thread is not seen). ``events``: a Counter of (phase, kind, site)."""

    def __init__(self):
        self.events: Counter = Counter()
        self._modes = (_FunctionMode(self), _DispatchMode(self))
        self._quiet = 0  # > 0 inside a call already counted (tolist, repr: their own ops don't count again)

    def record(self, kind: str) -> None:
        if self._quiet:
            return
        phase, site = locate(sys._getframe(2))
        self.events[(phase, kind, site)] += 1

    def __enter__(self) -> "SyncCounter":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def counts(self, kinds=SYNC_KINDS) -> Counter:
        """{(phase, kind): n} for ``kinds``."""
        out = Counter()
        for (phase, kind, _), n in self.events.items():
            if kind in kinds:
                out[(phase, kind)] += n
        return out

    def by_phase(self, kinds=SYNC_KINDS) -> Counter:
        out = Counter()
        for (phase, kind, _), n in self.events.items():
            if kind in kinds:
                out[phase] += n
        return out

    def sites(self, phase: str | None = None, kinds=SYNC_KINDS) -> Counter:
        """{(phase, kind, site): n} of ``kinds`` (in ``phase``)."""
        return Counter({k: n for k, n in self.events.items() if k[1] in kinds and (phase is None or k[0] == phase)})

    def total(self, kinds=SYNC_KINDS) -> int:
        return sum(n for (_, kind, _), n in self.events.items() if kind in kinds)

    def report(self) -> str:
        lines = [f"{'phase':<16}{'kind':<12}{'count':>6}  site"]
        for (phase, kind, site), n in sorted(self.events.items()):
            lines.append(f"{phase:<16}{kind:<12}{n:>6}  {site}")
        lines.append(f"syncs {self.total()}  (in step loops {sum(self.by_phase()[p] for p in STEP_PHASES)}), "
                     f"host-to-device copies {self.total(COPY_KINDS)}")
        return "\n".join(lines)


class _Counting:
    """A torch mode that records into ``counter`` (the dispatch and the function mode below)."""

    def __init__(self, counter: SyncCounter):
        super().__init__()
        self.counter = counter


class _DispatchMode(_Counting, TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = dispatch_kind(func, args, kwargs)
        if kind is not None:
            self.counter.record(kind)
        return func(*args, **kwargs)


_QUIET_METHODS = {torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "tolist", torch.Tensor.__repr__: "print",
                  torch.Tensor.__str__: "print", torch.Tensor.__format__: "print"}


class _FunctionMode(_Counting, TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _QUIET_METHODS.get(func)
        if kind is None and func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type == "cpu":
            # only the moves fastvideo makes itself (a library's .to(device) of its own device
            # tensors is a no-op on the accelerator, and on the CPU the two cannot be told apart)
            caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
            if _to_device_arg(args, kwargs) is not None and "/fastvideo/" in caller:
                self.counter.record("to_device")
        if kind is None:
            return func(*args, **kwargs)
        self.counter.record(kind)
        self.counter._quiet += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.counter._quiet -= 1
