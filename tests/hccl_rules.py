"""HCCL's runtime rules, enforced on the gloo collectives of the CPU tests.

Gloo accepts things HCCL rejects (a float64 all_reduce above all), so a CPU test can pass while the
same code dies on an Ascend machine at its first collective. ``install()`` wraps every collective of
``torch.distributed`` that the code issues (module functions and the names ``distributed_c10d`` uses
internally, so object collectives are checked through the tensors they really send) and raises,
with HCCL's own wording, where torch_npu's ProcessGroupHCCL would.

Source of every rule: torch_npu 2.7.1 = Ascend/pytorch tag ``v7.2.0-pytorch2.7.1``:

- ``torch_npu/csrc/distributed/HCCLUtils.cpp`` ``kScalarTypeToHcclDataType``: the dtypes any
  collective can carry (uint8, int8, int16, int32, int64, fp16, fp32, fp64, bool, bf16); anything
  else (complex...) -> "Unsupported data type for HCCL process group".
- ``torch_npu/csrc/distributed/ProcessGroupHCCL.cpp`` ``checkSupportedDataType``: allreduce,
  reduce, reduce_scatter and _reduce_scatter_base accept only int8, int16, int32, int64, fp16,
  fp32, bf16 ("AllGather & Broadcast support all data type"); the error reads
  "HCCL allreduce: Unsupported data type at::kDouble".
- same file, ``getHcclReduceOp``: AVG is done as SUM then divide (supported); BAND/BOR/BXOR ->
  "Cannot use ReduceOp.BAND with HCCL"; ``gather`` -> "ProcessGroupHCCL does not support gather".
- same file, ``check_npu_*``: "Tensors must be NPU and dense", "Tensors must be contiguous".
- Issue #19 (CANN collective documentation; not in torch_npu's source): all_gather_into_tensor and
  reduce_scatter_tensor do not support world sizes 3, 5, 6 or 7.

The device rule compares each tensor with the process's device (``FASTVIDEO_DEVICE`` and
``LOCAL_RANK``, as fastvideo.devices binds it): on the CPU tests that device is the CPU, so the rule
only bites when the harness runs on an accelerator.

Switch: ``FLUX_GRPO_HCCL_RULES=1`` (tests/conftest.py sets it by default; run_distributed installs it
in each child, and tests/hccl_site/sitecustomize.py in torchrun children).
"""

from __future__ import annotations

import functools
import inspect
import os

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

ENV = "FLUX_GRPO_HCCL_RULES"

# HCCLUtils.cpp kScalarTypeToHcclDataType and kHcclDataTypeToStringMap.
HCCL_TYPE_NAMES = {
    torch.uint8: "at::kByte/at::kBool", torch.bool: "at::kByte/at::kBool", torch.int8: "at::kChar",
    torch.int16: "at::kShort", torch.int32: "at::kInt", torch.int64: "at::kLong", torch.float16: "at::kHalf",
    torch.float32: "at::kFloat", torch.float64: "at::kDouble", torch.bfloat16: "at::kBFloat16",
}
# ProcessGroupHCCL.cpp checkSupportedDataType.
REDUCE_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
                           torch.bfloat16})
UNSUPPORTED_OPS = {"BAND", "BOR", "BXOR"}
TENSOR_COLLECTIVE_BAD_WORLD_SIZES = frozenset({3, 5, 6, 7})


class HcclRuleError(RuntimeError):
    """What ProcessGroupHCCL would have raised."""


def enabled() -> bool:
    return os.environ.get(ENV, "0") == "1"


def process_device() -> torch.device:
    kind = os.environ.get("FASTVIDEO_DEVICE", "cpu") or "cpu"
    return torch.device("cpu") if kind == "cpu" else torch.device(kind, int(os.environ.get("LOCAL_RANK", 0)))


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def check_tensor(t: torch.Tensor, hccl_name: str, reduces: bool) -> None:
    if t.dtype not in HCCL_TYPE_NAMES:
        raise HcclRuleError(f"Unsupported data type for HCCL process group (HCCL {hccl_name}: {t.dtype})")
    if reduces and t.dtype not in REDUCE_DTYPES:
        raise HcclRuleError(f"HCCL {hccl_name}: Unsupported data type {HCCL_TYPE_NAMES[t.dtype]}")
    if t.device != process_device() or t.is_sparse:
        raise HcclRuleError(f"Tensors must be NPU and dense (HCCL {hccl_name}: tensor on {t.device}, "
                            f"this process's device is {process_device()})")
    if not t.is_contiguous():
        raise HcclRuleError(f"Tensors must be contiguous (HCCL {hccl_name})")


def check_op(op, hccl_name: str) -> None:
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    if name.upper() in UNSUPPORTED_OPS:
        raise HcclRuleError(f"Cannot use ReduceOp.{name.upper()} with HCCL ({hccl_name})")


def check_world_size(group, hccl_name: str) -> None:
    size = dist.get_world_size(group)
    if size in TENSOR_COLLECTIVE_BAD_WORLD_SIZES:
        raise HcclRuleError(f"HCCL {hccl_name}: world size {size} is not supported (sizes 3, 5, 6 and 7 are not)")


# name in torch.distributed -> (HCCL's function name, reduces?, checks world size?)
RULES = {
    "all_reduce": ("allreduce", True, False),
    "reduce": ("reduce", True, False),
    "reduce_scatter": ("reduce_scatter", True, False),
    "reduce_scatter_tensor": ("_reduce_scatter_base", True, True),
    "all_gather": ("allgather", False, False),
    "all_gather_into_tensor": ("_allgather_base", False, True),
    "broadcast": ("broadcast", False, False),
    "scatter": ("scatter", False, False),
    "all_to_all_single": ("alltoall_base", False, False),
    # torch >= 2.10: what FSDP1 calls directly (the gradient reduce-scatter; the parameter gather on
    # an accelerator), and what all_gather_into_tensor / reduce_scatter_tensor now call inside.
    "all_gather_single": ("_allgather_base", False, True),
    "reduce_scatter_single": ("_reduce_scatter_base", True, True),
}
# Object collectives and barrier are checked through the tensor collectives they issue; wrapping
# them too records that they ran.
PASS_THROUGH = ("broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list", "barrier")

calls: dict[str, int] = {}


def _wrap(name: str, fn):
    hccl_name, reduces, sized = RULES.get(name, (name, False, False))
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if name in RULES:
            bound = signature.bind(*args, **kwargs)
            for key, value in bound.arguments.items():
                if key not in ("group", "op", "src", "dst", "async_op", "group_src", "group_dst"):
                    for t in _tensors(value):
                        check_tensor(t, hccl_name, reduces)
            if reduces:
                check_op(bound.arguments.get("op", dist.ReduceOp.SUM), hccl_name)
            if sized:
                check_world_size(bound.arguments.get("group"), hccl_name)
        calls[name] = calls.get(name, 0) + 1
        return fn(*args, **kwargs)

    checked.__hccl_rules__ = True
    return checked


def _refuse_gather(*args, **kwargs):
    raise HcclRuleError("ProcessGroupHCCL does not support gather")


_ORIGINALS: dict = {}  # name -> the collective install() wrapped (uninstall() puts it back)


def install() -> None:
    """Wrap the collectives in torch.distributed and distributed_c10d (idempotent)."""
    present = [name for name in (*RULES, *PASS_THROUGH) if hasattr(c10d, name)]  # *_single: torch >= 2.10
    for name in (*present, "gather"):
        _ORIGINALS.setdefault(name, getattr(c10d, name))
    for name in present:
        original = getattr(c10d, name)
        if getattr(original, "__hccl_rules__", False):
            continue
        wrapped = _wrap(name, original)
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)
    dist.gather = c10d.gather = _refuse_gather


def uninstall() -> None:
    """Undo install(): a process forked from one that has the rules (an xdist worker started with
    tests/hccl_site on PYTHONPATH) and told FLUX_GRPO_HCCL_RULES=0 gets plain gloo back."""
    for name, original in _ORIGINALS.items():
        setattr(c10d, name, original)
        setattr(dist, name, original)
    _ORIGINALS.clear()


def apply(enabled_now: bool) -> None:
    """install() or uninstall(), as a test child's FLUX_GRPO_HCCL_RULES says."""
    install() if enabled_now else uninstall()


def install_if_enabled() -> bool:
    if enabled():
        install()
        return True
    return False
