"""Serve registered rewards over HTTP, for trainers on other machines (``--rewards remote:...``).

    python -m fastvideo.tools.reward_server --rewards "hpsv2,pickscore" --device auto \\
        --hps_ckpt_dir ./hps_ckpt --pickscore_dir ./pickscore_ckpt --host 0.0.0.0 --port 8000

Endpoints (FastAPI on uvicorn; ``pip install -e .[server]``):

- ``GET /health``: ``{"status": "ok", "flux_grpo_version": ..., "device": ...,
  "rewards": {name: {"class", "module", "batch_size", "files"}}}``;
- ``POST /score/{name}``: body in the format of fastvideo/rewards/wire.py (a batch of images and
  prompts); reply ``{"scores": [B floats]}``, the raw (unweighted) scores. Weights in
  ``--rewards`` are accepted and ignored here: the trainer's ``--rewards`` weighs.

``--plugin NAME=MODULE:FACTORY`` serves a reward that is not built in (e.g. one whose package
needs other library versions than the trainer's, run in its own environment): the server imports
MODULE, calls ``FACTORY(device=torch.device, batch_size=int)`` once and serves the callable it
returns as NAME; that callable takes ``(images, prompts)`` like every reward (a float tensor
``[B, 3, H, W]`` in [0, 1] or a list of PIL images, and B strings) and returns B scores.

One model call at a time per reward (a lock): requests from several trainer ranks queue instead of
running two forward passes on one device at once. The trainer side is rewards/remote.py.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint annotations (Request) as objects.

import argparse
import logging
import threading
from typing import Any, Mapping

import torch

import fastvideo
from fastvideo import devices
from fastvideo.rewards.base import Reward, RewardInputError, build_reward, check_inputs
from fastvideo.rewards.combine import RewardSpecError, parse_reward_spec
from fastvideo.rewards.flags import add_reward_flags, extras_from_args, reward_kwargs
from fastvideo.rewards.wire import WireFormatError, decode_request
from fastvideo.utils import require

SERVER_VERSION = 1
log = logging.getLogger(__name__)


def served_info(name: str, reward: Reward, kwargs: Mapping[str, Any]) -> dict:
    """What /health says about one reward: its class, batch size and the files it loaded."""
    files = {k: str(v) for k, v in kwargs.items() if k.endswith(("_dir", "_name", "_file"))}
    return {"class": type(reward).__name__, "module": type(reward).__module__,
            "batch_size": getattr(reward, "batch_size", None), "files": files}


def build_app(rewards: Mapping[str, Reward], info: Mapping[str, dict] | None = None,
              device: str = "cpu"):
    """The FastAPI app serving ``rewards`` (name -> reward)."""
    fastapi = require("fastapi", "server", "the reward server")
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    app = fastapi.FastAPI(title="flux-grpo reward server", version=fastvideo.__version__)
    # Intra-op threads are a per-thread setting: the pool threads that score would otherwise use
    # the default count whatever this thread was set to, and a different count can change float
    # rounding (remote scores are meant to equal in-process ones bit for bit).
    threads = torch.get_num_threads()
    on_accelerator, bound = devices.is_accelerator(device), threading.local()
    locks = {name: threading.Lock() for name in rewards}
    health = {"status": "ok", "server_version": SERVER_VERSION, "flux_grpo_version": fastvideo.__version__,
              "device": device, "rewards": dict(info or {n: {} for n in rewards})}

    @app.get("/health")
    def get_health() -> dict:
        return health

    def score(name: str, body: bytes) -> JSONResponse:
        # A sync function: FastAPI runs it in its thread pool, so the event loop stays free.
        if name not in rewards:
            return JSONResponse({"detail": f"unknown reward {name!r}; served: {sorted(rewards)}"}, 404)
        try:
            images, prompts = decode_request(body)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            if on_accelerator and not getattr(bound, "done", False):
                devices.set_device(torch.device(device))  # the current device is per thread too
                bound.done = True
            with locks[name]:
                scores = rewards[name](images, prompts)
        except (WireFormatError, RewardInputError) as exc:
            return JSONResponse({"detail": f"bad request: {exc}"}, 400)
        except Exception as exc:  # noqa: BLE001 - the client gets the reason (and retries a 5xx)
            log.exception("scoring with %s failed", name)
            return JSONResponse({"detail": f"{name} failed: {type(exc).__name__}: {exc}"}, 500)
        return JSONResponse({"scores": scores.float().tolist()})

    @app.post("/score/{name}")
    async def post_score(name: str, request: Request):
        body = await request.body()
        return await run_in_threadpool(score, name, body)

    return app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reward_server", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rewards", default=None, help='rewards to serve, e.g. "hpsv2,pickscore" '
                   "(weights, if given, are ignored: the client weighs)")
    p.add_argument("--plugin", action="append", default=[], metavar="NAME=MODULE:FACTORY",
                   help="also serve FACTORY(device=..., batch_size=...)'s reward as NAME (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept other machines")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="auto", choices=["auto", "cpu"],
                   help="auto: this machine's accelerator (NPU or GPU) if any, else the CPU")
    p.add_argument("--device_index", type=int, default=0, help="which accelerator")
    p.add_argument("--reward_precision", "--dtype", dest="reward_precision", default="auto",
                   choices=["auto", "fp16", "bf16", "fp32"],
                   help="autocast dtype, as the trainer's --reward_precision: auto = fp16 on an accelerator "
                        "(upstream's HPS scoring), fp32 on the CPU")
    p.add_argument("--batch_size", type=int, default=16, help="images per model call")
    g = p.add_argument_group("reward files (as the trainer's flags)")
    g.add_argument("--hps_ckpt_dir", default="./hps_ckpt")
    g.add_argument("--hps_model_name", default="ViT-H-14")
    g.add_argument("--pickscore_dir", default="./pickscore_ckpt")
    g.add_argument("--pickscore_processor_dir", default=None)
    g.add_argument("--clip_dir", default="./clip_ckpt")
    add_reward_flags(p, client=False)
    return p


class PluginReward:
    """A plugin's callable with the reward contract enforced: inputs checked, [B] float32 out."""

    def __init__(self, name: str, fn, batch_size: int) -> None:
        self.name, self.fn, self.batch_size = name, fn, batch_size

    def __call__(self, images, prompts) -> torch.Tensor:
        n = check_inputs(images, prompts)
        scores = torch.as_tensor(self.fn(images, list(prompts))).detach().float().reshape(-1).cpu()
        if scores.shape != (n,):
            raise RuntimeError(f"plugin reward {self.name!r} returned {list(scores.shape)} scores for {n} images")
        return scores


def load_plugin(text: str, device: torch.device, batch_size: int) -> tuple[str, PluginReward, dict]:
    """``NAME=MODULE:FACTORY`` -> (NAME, reward, its /health record)."""
    import importlib

    name, eq, target = text.partition("=")
    module, colon, factory = target.partition(":")
    if not (eq and colon and name.strip() and module and factory):
        raise ValueError(f"--plugin {text!r}: use NAME=MODULE:FACTORY, e.g. hpsv3=my_hpsv3:build")
    fn = getattr(importlib.import_module(module), factory)(device=device, batch_size=batch_size)
    if not callable(fn):
        raise TypeError(f"--plugin {text!r}: {module}.{factory}(...) returned a {type(fn).__name__}, not a callable")
    info = {"class": type(fn).__name__, "module": module, "batch_size": batch_size, "files": {}, "plugin": target}
    return name.strip(), PluginReward(name.strip(), fn, batch_size), info


def build_rewards(args: argparse.Namespace) -> tuple[dict[str, Reward], dict[str, dict], torch.device]:
    if not args.rewards and not args.plugin:
        raise ValueError("nothing to serve: give --rewards NAMES and/or --plugin NAME=MODULE:FACTORY")
    specs = parse_reward_spec(args.rewards) if args.rewards else []
    remote = [s.name for s in specs if s.url is not None]
    if remote:
        raise RewardSpecError(f"a reward server serves local rewards only; got {remote}")
    device = devices.get_device(args.device_index, "cpu" if args.device == "cpu" else None)
    per = {
        "hpsv2": {"hps_ckpt_dir": args.hps_ckpt_dir, "model_name": args.hps_model_name},
        "pickscore": {"pickscore_dir": args.pickscore_dir, "processor_dir": args.pickscore_processor_dir},
        "clip": {"clip_dir": args.clip_dir},
        **reward_kwargs(extras_from_args(args)),
    }
    from fastvideo.training.builders import reward_dtype

    common = {"device": device, "batch_size": args.batch_size, "dtype": reward_dtype(args.reward_precision)}
    rewards, info = {}, {}
    for s in specs:
        kwargs = {**common, **per.get(s.name, {})}
        rewards[s.name] = build_reward(s.name, **kwargs)
        info[s.name] = served_info(s.name, rewards[s.name], kwargs)
    for text in args.plugin:
        name, reward, record = load_plugin(text, device, args.batch_size)
        if name in rewards:
            raise ValueError(f"--plugin {text!r}: {name!r} is already served")
        rewards[name], info[name] = reward, record
    return rewards, info, device


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    uvicorn = require("uvicorn", "server", "the reward server")
    rewards, info, device = build_rewards(args)
    print(f"[reward_server] serving {', '.join(rewards)} on {device} at http://{args.host}:{args.port}",
          flush=True)
    uvicorn.run(build_app(rewards, info, str(device)), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
