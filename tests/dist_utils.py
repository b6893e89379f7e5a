"""Run a function in N gloo processes on CPU, and the tiny FLUX transformer the distributed tests share.

    def body(info, arg): ...                      # module-level, so spawned children can import it
    results = run_distributed(body, arg, world_size=2)   # [rank 0's return value, rank 1's ...]

Return values travel by torch.save / torch.load(weights_only=True): tensors, numbers, strings,
None and lists / tuples / dicts of them.

Each child gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_*) and
FASTVIDEO_DEVICE=cpu, installs HCCL's collective rules (tests/hccl_rules.py) when
FLUX_GRPO_HCCL_RULES=1 (tests/conftest.py's default; pass env={"FLUX_GRPO_HCCL_RULES": "0"} to opt out), initialises the process group through fastvideo.devices.init_distributed,
and runs one thread. A child's exception fails the test with the child's full traceback; the other
children are terminated at once instead of waiting in a collective.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback
from typing import Any, Callable

import torch

_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:  # children import hccl_rules from here
    sys.path.insert(0, _TESTS)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, world_size, port, env, results, args):
    local_world = int(env.get("LOCAL_WORLD_SIZE", world_size))
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % local_world), LOCAL_WORLD_SIZE=str(local_world), FASTVIDEO_DEVICE="cpu",
        OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
    )
    os.environ.update({k: str(v) for k, v in env.items()})
    torch.set_num_threads(1)
    import hccl_rules

    hccl_rules.apply(os.environ.get("FLUX_GRPO_HCCL_RULES", "0") == "1")  # off: also undone if inherited
    from fastvideo import devices

    try:
        info = devices.init_distributed(timeout_s=120)
        result = fn(info, *args)
        # Serialised by value: a tensor sent through the queue as-is would be shared memory whose
        # owner (this process) may exit before the parent reads it.
        buffer = io.BytesIO()
        torch.save(result, buffer)
        results.put((rank, True, buffer.getvalue()))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        results.put((rank, False, traceback.format_exc()))
    finally:
        devices.destroy_distributed()


def _preload() -> None:
    """Import once in the parent what every child needs, so forked children do not each pay for it."""
    import diffusers.models.transformers.transformer_flux  # noqa: F401
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401


def run_distributed(
    fn: Callable[..., Any], *args, world_size: int = 2, env: dict | None = None, timeout: float = 240.0,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(info, *args)`` on ``world_size`` ranks; return their results by rank.

    Processes are forked where the platform allows: the children then start in milliseconds with
    torch and diffusers already imported, instead of seconds each. That is safe here because the
    parent never initialises a process group and each child runs single-threaded (set before any
    torch op), the same discipline as torch's DataLoader workers. ``start_method="spawn"`` (or
    FLUX_GRPO_TEST_START_METHOD=spawn) gives fully fresh interpreters instead.
    """
    method = start_method or os.environ.get("FLUX_GRPO_TEST_START_METHOD") or (
        "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    )
    if method == "fork":
        _preload()
    ctx = mp.get_context(method)
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(fn, r, world_size, port, dict(env or {}), results, args), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"distributed test did not finish in {timeout:.0f} s (ranks done: {sorted(out)})")
            try:
                rank, ok, payload = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in out]
                if dead:
                    raise RuntimeError(f"rank(s) {dead} died without reporting (exit codes "
                                       f"{[procs[i].exitcode for i in dead]})") from None
                continue
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{payload}")
            out[rank] = torch.load(io.BytesIO(payload), weights_only=True)
    finally:
        for p in procs:
            if p.is_alive() and len(out) < world_size:
                p.terminate()
        for p in procs:
            p.join(timeout=30)
    return [out[r] for r in range(world_size)]


# ---------------------------------------------------------------- the tiny transformer
def tiny_transformer(seed: int = 0, **config):
    """The tiny preset's FluxTransformer2DModel (one double and one single block, or what ``config``
    overrides, e.g. num_layers=2) with every weight non-zero, built in memory; the same seed gives
    the same weights in every process."""
    from diffusers import FluxTransformer2DModel

    from fastvideo.tools.make_tiny_flux import PRESETS, transformer_config

    torch.manual_seed(seed)
    model = FluxTransformer2DModel.from_config({**transformer_config(PRESETS["tiny"]), **config})
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if torch.count_nonzero(param) == 0 and "norm" not in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.02)
    return model


def tiny_inputs(seed: int, batch: int = 1) -> dict:
    """Keyword inputs for tiny_transformer: an 8x8 latent (16 tokens of 64 channels), 8 text tokens."""
    from fastvideo.models import flux

    g = torch.Generator().manual_seed(1000 + seed)
    return {
        "hidden_states": torch.randn(batch, 16, 64, generator=g),
        "encoder_hidden_states": torch.randn(batch, 8, 32, generator=g),
        "pooled_projections": torch.randn(batch, 32, generator=g),
        "timestep": torch.rand(batch, generator=g),
        "guidance": torch.full((batch,), 3.5),
        "img_ids": flux.image_ids(8, 8),
        "txt_ids": flux.text_ids(8),
        "return_dict": False,
    }


def loss_fn(model, inputs: dict) -> torch.Tensor:
    """A scalar that depends on every output element with distinct weights."""
    out = model(**inputs)[0]
    w = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape)
    return (out * w).sum() + out.square().mean()
