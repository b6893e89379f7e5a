"""The one place that names devices and distributed backends.

Every other module asks this one for the device, the backend, autocast, memory figures and
collectives, so the same code runs on Ascend NPU (torch_npu + HCCL), NVIDIA GPU (NCCL) and CPU
(gloo). Device preference is npu > cuda > cpu, overridable with ``FASTVIDEO_DEVICE``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import resource
import sys
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist

from fastvideo.errors import ConfigError, DeviceError

NPU = "npu"
CUDA = "cuda"
CPU = "cpu"
DEVICE_TYPES = (NPU, CUDA, CPU)
BACKENDS = {NPU: "hccl", CUDA: "nccl", CPU: "gloo"}
ENV_DEVICE = "FASTVIDEO_DEVICE"

_torch_npu = None
_torch_npu_checked = False


def import_torch_npu():
    """Import torch_npu if it is installed and usable, else return None.

    Without CANN, importing torch_npu raises ImportError, OSError or RuntimeError; all three mean
    "no NPU here".
    """
    global _torch_npu, _torch_npu_checked
    if not _torch_npu_checked:
        _torch_npu_checked = True
        try:
            import torch_npu  # noqa: F401

            _torch_npu = torch_npu
        except (ImportError, OSError, RuntimeError):
            _torch_npu = None
    return _torch_npu


def npu_available() -> bool:
    if import_torch_npu() is None:
        return False
    npu = getattr(torch, NPU, None)
    return bool(npu is not None and npu.is_available())


def cuda_available() -> bool:
    return torch.cuda.is_available()


def device_type_problem(forced: str) -> str | None:
    """What is wrong with FASTVIDEO_DEVICE=``forced`` here (None: nothing)."""
    if forced not in DEVICE_TYPES:
        return f"{ENV_DEVICE}={forced!r} is not a device type; use one of {', '.join(DEVICE_TYPES)}"
    if forced == NPU and not npu_available():
        return (f"{ENV_DEVICE}=npu but no NPU is usable: install the npu extra "
                "(bash env_setup.sh --target npu) and source CANN's set_env.sh")
    if forced == CUDA and not cuda_available():
        return f"{ENV_DEVICE}=cuda but torch.cuda.is_available() is False"
    return None


def device_type() -> str:
    """'npu', 'cuda' or 'cpu': FASTVIDEO_DEVICE if set, else the best available."""
    forced = os.environ.get(ENV_DEVICE, "").strip().lower()
    if forced:
        problem = device_type_problem(forced)
        if problem:
            raise DeviceError(problem)  # the user's environment: one line, exit 2
        return forced
    if npu_available():
        return NPU
    if cuda_available():
        return CUDA
    return CPU


def is_npu(device: torch.device | str | None = None) -> bool:
    if device is None:
        return device_type() == NPU
    return torch.device(device).type == NPU


def is_accelerator(device: torch.device | str) -> bool:
    return torch.device(device).type in (NPU, CUDA)


def dist_backend(dtype: str | None = None) -> str:
    """hccl / nccl / gloo for the given (or detected) device type."""
    return BACKENDS[dtype or device_type()]


def _device_module(dtype: str):
    return getattr(torch, dtype, None)


def get_device(local_rank: int = 0, dtype: str | None = None) -> torch.device:
    dtype = dtype or device_type()
    if dtype == CPU:
        return torch.device(CPU)
    return torch.device(dtype, local_rank)


def set_device(device: torch.device) -> None:
    if device.type in (NPU, CUDA):
        _device_module(device.type).set_device(device)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment, or a single process."""
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("LOCAL_RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
    )


# HCCL's all_gather_into_tensor / reduce_scatter_tensor (FSDP's collectives) do not support these
# world sizes (CANN collective documentation, as summarised in issue #19).
HCCL_UNSUPPORTED_WORLD_SIZES = (3, 5, 6, 7)
ENV_VISIBLE_NPUS = "ASCEND_RT_VISIBLE_DEVICES"


def parse_visible_npus(value: str) -> list[int]:
    """ASCEND_RT_VISIBLE_DEVICES -> die ids; ValueError unless comma-separated ascending integers.
    CANN stops reading at the first other character, so "0-15" would silently mean die 0 only."""
    parts = value.split(",")
    if not all(p.strip().isdigit() for p in parts):
        n = value.split("-")[-1] if "-" in value else None
        example = ",".join(str(i) for i in range(int(n) + 1)) if n and n.isdigit() and int(n) < 64 else "0,1,2,3"
        raise ValueError(f"{ENV_VISIBLE_NPUS}={value!r}: list the dies one by one, comma-separated "
                         f"(e.g. {ENV_VISIBLE_NPUS}={example}); CANN reads no ranges and stops at the first "
                         "other character")
    ids = [int(p) for p in parts]
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(f"{ENV_VISIBLE_NPUS}={value!r}: die ids must be ascending without repeats "
                         f"(e.g. {','.join(map(str, sorted(set(ids))))})")
    return ids


def npu_launch_problems(world_size: int, local_world_size: int, visible: str | None,
                        device_count: int | None) -> list[str]:
    """What would make an NPU run fail or misbehave, found before any model loads (empty if none)."""
    problems = []
    if world_size in HCCL_UNSUPPORTED_WORLD_SIZES:
        problems.append(f"world size {world_size}: HCCL's all_gather_into_tensor and reduce_scatter_tensor "
                        f"(used by FSDP) do not support {HCCL_UNSUPPORTED_WORLD_SIZES}; use 1, 2, 4, 8 or 16 "
                        "processes")
    dies = device_count
    if visible:
        try:
            dies = len(parse_visible_npus(visible))
        except ValueError as err:
            problems.append(str(err))
    if dies is not None and local_world_size > dies:
        problems.append(f"{local_world_size} processes on this node but only {dies} NPU dies visible: lower "
                        f"--nproc_per_node (NPROC) or widen {ENV_VISIBLE_NPUS}")
    return problems


def check_npu_launch(world_size: int) -> None:
    """Raise ValueError naming every problem of npu_launch_problems for this process's launch."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    module = _device_module(NPU)
    count = int(module.device_count()) if module is not None and hasattr(module, "device_count") else None
    problems = npu_launch_problems(world_size, local, os.environ.get(ENV_VISIBLE_NPUS), count)
    if problems:
        raise ValueError("cannot start on NPU:\n  - " + "\n  - ".join(problems))


def init_distributed(timeout_s: float = 1800.0) -> DistInfo:
    """Initialise the process group (when launched by torchrun) and bind the local device.

    The device index is the LOCAL rank: the global rank breaks on multi-node runs.
    A single process without torchrun's variables gets world size 1 and no process group.
    """
    rank, local_rank, world_size = dist_env()
    dtype = device_type()
    if dtype == NPU:
        check_npu_launch(world_size)
    device = get_device(local_rank, dtype)
    set_device(device)
    if world_size > 1 and not dist.is_initialized():
        unset = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
        if unset:  # env:// would raise a ValueError with a traceback
            raise ConfigError(f"WORLD_SIZE={world_size} but {' and '.join(unset)} not set: start the ranks with "
                              f"torchrun or python -m fastvideo.launch (they set them), or unset WORLD_SIZE and "
                              f"RANK for one process")
        kwargs = {}
        if dtype != CPU:
            kwargs["device_id"] = device
        dist.init_process_group(
            backend=dist_backend(dtype),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def destroy_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """In-place mean across ranks as SUM / world size (HCCL has no ReduceOp.AVG)."""
    n = world_size()
    if n > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(n)
    return tensor


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def autocast(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, enabled: bool = True):
    """torch.autocast for the device's type ('npu', 'cuda' or 'cpu'); a no-op when disabled
    or when dtype is float32."""
    dev_type = torch.device(device).type
    if not enabled or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(dev_type, dtype=dtype)


def set_fast_matmul(device: torch.device | str, enabled: bool) -> None:
    """--allow_tf32: TF32 on CUDA, HF32 on NPU, for matmuls AND convolutions; off, fp32 is fp32.

    Set both ways on purpose: cuDNN convolutions default to TF32 in torch, and torch_npu 2.7.1
    defaults ``npu.conv.allow_hf32`` to True (``npu.matmul.allow_hf32`` to False; Ascend/pytorch
    v7.2.0-pytorch2.7.1 torch_npu/csrc/framework/LazyInitAclops.cpp), so without this the VAE and
    the reward towers would run reduced-precision convolutions while CPU runs are exact, and the
    alignment method (which compares fp32 work across devices) would see the difference.
    Nothing on CPU.
    """
    # A string is parsed by hand: "npu" is a torch device type only once torch_npu is loaded.
    dev_type = device.split(":")[0] if isinstance(device, str) else torch.device(device).type
    if dev_type == CUDA:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
    elif dev_type == NPU:
        torch_npu = import_torch_npu()
        if torch_npu is not None:
            torch_npu.npu.matmul.allow_hf32 = enabled
            torch_npu.npu.conv.allow_hf32 = enabled


def enable_fast_matmul(device: torch.device | str) -> None:
    set_fast_matmul(device, True)


def synchronize(device: torch.device | str) -> None:
    dev_type = torch.device(device).type
    if dev_type in (NPU, CUDA):
        _device_module(dev_type).synchronize()


def reset_peak_memory(device: torch.device | str) -> None:
    dev_type = torch.device(device).type
    if dev_type in (NPU, CUDA):
        _device_module(dev_type).reset_peak_memory_stats()


def peak_memory_bytes(device: torch.device | str) -> int:
    """Peak allocated device memory; on CPU the process's peak resident set size."""
    dev_type = torch.device(device).type
    if dev_type in (NPU, CUDA):
        return int(_device_module(dev_type).max_memory_allocated())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def total_memory_bytes(dev_type: str) -> int | None:
    """One device's memory (the first visible accelerator of ``dev_type``), or for the CPU the
    host's RAM (all ranks of a node share it); None when it cannot be read."""
    if dev_type == CPU:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # not POSIX
            return None
    module = _device_module(dev_type)
    if module is None or not module.is_available() or module.device_count() < 1:
        return None
    return int(module.get_device_properties(0).total_memory)


def empty_cache(device: torch.device | str) -> None:
    dev_type = torch.device(device).type
    if dev_type in (NPU, CUDA):
        _device_module(dev_type).empty_cache()


def record_event(device: torch.device | str):
    """An event marking the work queued so far on the current stream of an accelerator; None on
    CPU (where work is done when the call returns)."""
    dev_type = torch.device(device).type
    if dev_type not in (NPU, CUDA):
        return None
    event = _device_module(dev_type).Event()
    event.record()
    return event


def new_stream(device: torch.device | str):
    """A fresh stream on an accelerator, for work that should run beside the main stream; None
    on CPU."""
    device = torch.device(device)
    if device.type not in (NPU, CUDA):
        return None
    return _device_module(device.type).Stream(device=device)


@contextlib.contextmanager
def on_stream(device: torch.device | str, stream, after=None) -> Iterator[None]:
    """Queue the block's work on ``stream`` once ``after`` (an event from record_event) has
    happened. torch.cuda and torch_npu's torch.npu share this Stream/Event API. A no-op on CPU."""
    dev_type = torch.device(device).type
    if stream is None or dev_type not in (NPU, CUDA):
        yield
        return
    if after is not None:
        stream.wait_event(after)
    with _device_module(dev_type).stream(stream):
        yield


def host_buffer(shape, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialised host tensor to draw data into that is bound for ``device``: page-locked
    (pinned) when ``device`` is an accelerator, so that to_device can copy it without the host
    waiting; ordinary memory for the CPU (nothing is copied there)."""
    return torch.empty(shape, dtype=dtype, pin_memory=is_accelerator(_type_name(device)))


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` (on the host) on ``device``: on an accelerator from pinned memory (pinned first
    when it is not: host_buffer avoids that copy) asynchronously, the copy queued on the current
    stream before the work that uses it while the host goes on (torch's pinned-memory allocator
    keeps the buffer until the copy is done); the tensor itself on the CPU."""
    device = torch.device(device)
    if not is_accelerator(device):
        return tensor.to(device)
    return (tensor if tensor.is_pinned() else tensor.pin_memory()).to(device, non_blocking=True)


def fused_adamw_supported(device: torch.device | str) -> bool:
    """Whether torch.optim.AdamW(fused=True) has a kernel (aten::_fused_adamw_) for ``device``:
    torch ships one for CPU and CUDA; on NPU only if torch_npu registers one for its dispatch key
    (PrivateUse1); torch_npu 2.7.1 (Ascend/pytorch v7.2.0-pytorch2.7.1) does not document one."""
    dev_type = _type_name(device)
    if dev_type in (CPU, CUDA):
        return True
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_adamw_", "PrivateUse1"))
    except (AttributeError, RuntimeError):
        return False


ADAMW_KERNELS = ("auto", "fused", "foreach", "loop")


def _type_name(device: torch.device | str) -> str:
    """"npu:0" -> "npu" without parsing it as a torch.device (which needs torch_npu loaded)."""
    return device.type if isinstance(device, torch.device) else str(device).split(":")[0]


def adamw_kernel_kwargs(device: torch.device | str, kernel: str = "auto") -> dict:
    """torch.optim.AdamW's kernel arguments for parameters on ``device``: ``fused`` (one kernel for
    all updates), ``foreach`` (multi-tensor), ``loop`` (one parameter at a time, torch's reference);
    ``auto`` is fused where fused_adamw_supported, else foreach. All of them keep the same
    optimizer state (per parameter: step, exp_avg, exp_avg_sq; tests/training/test_optimizer_kernels.py),
    so a checkpoint written with one resumes with another; their updates agree to rounding.

    Not torch_npu.optim.NpuFusedAdamW (Ascend/pytorch v7.2.0-pytorch2.7.1,
    torch_npu/optim/npu_fused_adamw.py and npu_fused_optim_base.py): it re-points every parameter
    and gradient into one combined buffer (npu_change_data_ptr) and documents that parameters must
    never be re-allocated, while FSDP swaps a flat parameter's storage at every gather and hands
    back new gradient tensors at every backward; it also refuses zero_grad(set_to_none=True) and
    keeps ``step`` as a Python int, unlike torch's AdamW state."""
    if kernel not in ADAMW_KERNELS:
        raise ValueError(f"unknown AdamW kernel {kernel!r}; choose one of {', '.join(ADAMW_KERNELS)}")
    if kernel == "auto":
        kernel = "fused" if fused_adamw_supported(device) else "foreach"
    if kernel == "fused":
        if not fused_adamw_supported(device):
            raise ValueError(f"the fused AdamW kernel is not available on {_type_name(device)}; "
                             "use --adamw_kernel foreach")
        return {"fused": True, "foreach": None}
    if kernel == "foreach":
        return {"fused": None, "foreach": True}
    return {"fused": False, "foreach": False}


COMPILE_BACKENDS = ("auto", "inductor", "aot_eager", "eager")
# TorchAir (torch.compile's NPU backend) ships inside torch_npu, no separate package: from Ascend
# Extension for PyTorch 7.2.0 with any PyTorch it supports (torch_npu 2.6.0.post3, 2.7.1, 2.8.0 and
# later); before 7.2.0 only with PyTorch 2.1.0. torch_npu must be imported before torchair
# (Ascend "TorchAir graph mode guide", installation page of the 7.2.0 and 7.3.0 documentation).
TORCHAIR_NEEDS = ("torch_npu from Ascend Extension for PyTorch 7.2.0 or later (e.g. torch_npu 2.7.1), which ships "
                  "TorchAir; before 7.2.0 TorchAir works only with PyTorch 2.1.0")


def compile_backend(device: torch.device | str, name: str = "auto"):
    """torch.compile's backend for blocks running on ``device``. ``auto``: inductor on CUDA and CPU
    (C++/OpenMP code through the system compiler on CPU), TorchAir's NPU backend on NPU. The debug
    backends: ``aot_eager`` (traces forward and backward through AOTAutograd, runs them eagerly:
    shows graph breaks and autograd problems without code generation) and ``eager`` (graph capture
    only). Raises ValueError naming the fix where the device cannot compile."""
    if name not in COMPILE_BACKENDS:
        raise ValueError(f"unknown compile backend {name!r}; choose one of {', '.join(COMPILE_BACKENDS)}")
    dev_type = _type_name(device)
    if dev_type != NPU:
        return "inductor" if name == "auto" else name
    if name == "inductor":
        raise ValueError("inductor generates no NPU code: use --compile_backend auto (TorchAir) on NPU")
    if name != "auto":
        return name
    return _torchair_backend()


def _torchair_backend():
    """TorchAir's torch.compile backend, or ValueError naming the torch_npu version that has it."""
    torch_npu = import_torch_npu()  # first: torchair imports only after torch_npu
    if torch_npu is None:
        raise ValueError("--compile on NPU needs torch_npu (bash env_setup.sh --target npu, CANN sourced)")
    try:
        import torchair
    except ImportError as err:
        version = getattr(torch_npu, "__version__", "unknown")
        raise ValueError(f"--compile on NPU needs TorchAir, but torch_npu {version} has none ({err}): install "
                         f"{TORCHAIR_NEEDS}, or run without --compile") from None
    return torchair.get_npu_backend(compiler_config=torchair.CompilerConfig())


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices). Draws that must agree across devices do not
    rely on this: they come from explicit CPU generators (see sampling.randomness)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def device_name(device: torch.device | str) -> str:
    dev_type = torch.device(device).type
    if dev_type == CUDA:
        return torch.cuda.get_device_name(torch.device(device))
    if dev_type == NPU:
        return str(_device_module(NPU).get_device_name(torch.device(device)))
    import platform as _pyplatform

    return _pyplatform.processor() or _pyplatform.machine()
