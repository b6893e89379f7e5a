"""Serve registered rewards over HTTP, for trainers on other machines (``--rewards remote:...``).

    python -m fastvideo.tools.reward_server --rewards "hpsv2,pickscore" --device auto \\
        --hps_ckpt_dir hps_ckpt --pickscore_dir data/pickscore --host 0.0.0.0 --port 8000

Endpoints (FastAPI on uvicorn; ``pip install -e .[server]``):

- ``GET /health``: ``{"status": "ok", "flux_grpo_version": ..., "device": ...,
  "rewards": {name: {"class", "module", "batch_size", "files", ["input_precision"]}}}`` (hpsv2's
  ``--hps_input``; "files" only with ``--health_details``);
- ``POST /score/{name}``: body in the format of fastvideo/rewards/wire.py (a batch of images and
  prompts); reply ``{"scores": [B floats]}``, the raw (unweighted) scores. Weights in
  ``--rewards`` are accepted and ignored here: the trainer's ``--rewards`` weighs.

``--plugin NAME=MODULE:FACTORY`` serves a reward that is not built in (e.g. one whose package
needs other library versions than the trainer's, run in its own environment): the server imports
MODULE, calls ``FACTORY(device=torch.device, batch_size=int)`` once and serves the callable it
returns as NAME; that callable takes ``(images, prompts)`` like every reward (a float tensor
``[B, 3, H, W]`` in [0, 1] or a list of PIL images, and B strings) and returns B scores. A callable
with the attribute ``uses_sources = True`` is also given ``sources=`` (editing: the samples' source
images, float ``[B, 3, H, W]`` in [0, 1]), as a built-in reward that uses them is (``clip_edit``);
/health then says ``"uses_sources": true`` and the trainer's client sends them.

A reward (or plugin callable) with ``takes_clips = True`` is served clips instead
(rewards/clip_wire.py: uint8 or float32 frames ``[B, F, 3, H, W]``, ``--max_clip_pixels`` frames x
pixels a request); /health says ``"takes_clips": true`` and the trainer's client sends its clips so.
A clip it fails on is answered ``null`` and listed under ``"failed"`` (rewards.video.score_clips_each):
the trainer drops it, never scoring it 0 or -1.

One model call at a time per reward (a lock): requests from several trainer ranks queue instead of
running two forward passes on one device at once. The trainer side is rewards/remote.py.

Every request is untrusted (tools/reward_server_guard.py): a token (``--token`` or
$FLUX_GRPO_REWARD_TOKEN; required beyond loopback), body/pixel/image limits checked before the
bytes are read or decoded, decoded pixels bounded per request and for the whole server, bodies read
before a scoring slot is taken, header and body timeouts, 4xx for the client's mistakes and 5xx only
for the server's own failures (or 503 "busy", which the client retries); ``/health`` lists model
files only with ``--health_details``.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint annotations (Request) as objects.

import argparse
import asyncio
import logging
import os
import sys
import threading
from typing import Any, Mapping

import torch

import fastvideo
from fastvideo import devices
from fastvideo.errors import UserError, one_line_errors
from fastvideo.rewards.base import Reward, RewardInputError, check_inputs, check_sources, takes_sources
from fastvideo.rewards.clip_wire import decode_clips, is_clip_request, parse_clip_request
from fastvideo.rewards.combine import RewardSpecError, parse_reward_spec
from fastvideo.rewards.flags import add_reward_flags, extras_from_args, model_reward_kwargs
from fastvideo.rewards.registry import build_reward
from fastvideo.rewards.video import check_clips, score_clips_each, takes_clips
from fastvideo.rewards.wire import WireFormatError, WireTooLargeError, decode_parsed, decode_sources, parse_request
from fastvideo.tools.reward_server_guard import (TOKEN_ENV, BodyBudget, BodyError, GuardMiddleware, PixelBudget,
                                                 ServerBusyError, ServerLimits, is_loopback, raise_open_file_limit,
                                                 uvicorn_settings)
from fastvideo.utils import require

SERVER_VERSION = 1
log = logging.getLogger("fastvideo.tools.reward_server")  # not __main__ under python -m


def served_info(name: str, reward: Reward, kwargs: Mapping[str, Any]) -> dict:
    """What /health says about one reward: its class, batch size and the files it loaded."""
    files = {k: str(v) for k, v in kwargs.items() if k.endswith(("_dir", "_name", "_file"))}
    record = {"class": type(reward).__name__, "module": type(reward).__module__,
              "batch_size": getattr(reward, "batch_size", None), "files": files}
    if "input_precision" in kwargs:  # hpsv2: which --hps_input path the scores come from
        record["input_precision"] = kwargs["input_precision"]
    if takes_sources(reward):  # editing: the client sends the source images (rewards/wire.py)
        record["uses_sources"] = True
        if getattr(reward, "sources_optional", False):  # scores text-to-image too (a trainer's pre-flight reads it)
            record["sources_optional"] = True
    if takes_clips(reward):  # video: the client sends whole clips (rewards/clip_wire.py)
        record["takes_clips"] = True
    return record


def nonfinite_reply(name: str, scores: torch.Tensor, failed: Mapping[int, str] | None = None) -> dict:
    """``{"scores": [B]}``; non-finite scores (JSON has no NaN) as null, listed under "nonfinite";
    clips the reward failed on (rewards.video.score_clips_each) null too, under "failed" with their
    reasons under "errors"."""
    values = scores.float().tolist()
    failed = dict(failed or {})
    bad = [i for i, ok in enumerate(torch.isfinite(scores.float()).tolist()) if not ok and i not in failed]
    if not bad and not failed:
        return {"scores": values}
    reply = {"scores": values, "reward": name}
    if bad:
        log.warning("%s returned non-finite scores for samples %s", name, bad)
        reply["nonfinite"] = bad
    if failed:
        log.warning("%s failed on clips %s: %s", name, sorted(failed), "; ".join(failed.values()))
        reply["failed"], reply["errors"] = sorted(failed), [failed[i] for i in sorted(failed)]
    for i in [*bad, *failed]:
        values[i] = None
    return reply


def make_scorer(rewards: Mapping[str, Reward], device: str, limits: ServerLimits):
    """``score(name, body) -> (status, reply)``: check, wait for room in the server's pixel budget,
    decode, score under the reward's lock, answer.

    Runs in the thread pool: the event loop stays free for /health while a model scores."""
    # Intra-op threads are a per-thread setting: the pool threads that score would otherwise use
    # the default count whatever this thread was set to, and a different count can change float
    # rounding (remote scores are meant to equal in-process ones bit for bit).
    threads = torch.get_num_threads()
    on_accelerator, bound = devices.is_accelerator(device), threading.local()
    locks = {name: threading.Lock() for name in rewards}
    pixels = PixelBudget(limits.max_server_pixels)

    def score(name: str, body: bytes) -> tuple[int, dict]:
        failed = {}
        try:
            clips = is_clip_request(body)
            if clips != takes_clips(rewards[name]):
                raise WireFormatError(f"{name} scores {'clips' if takes_clips(rewards[name]) else 'images'}: send "
                                      f"{'a clip request (rewards/clip_wire.py)' if not clips else 'images'}")
            parsed = (parse_clip_request(body, limits.max_pixels, limits.max_images, limits.max_clip_pixels) if clips
                      else parse_request(body, limits.max_pixels, limits.max_images, limits.max_request_pixels))
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            if on_accelerator and not getattr(bound, "done", False):
                devices.set_device(torch.device(device))  # the current device is per thread too
                bound.done = True
            with pixels.hold(parsed.pixels, limits.read_timeout_s):  # a clip's: frames x pixels
                if clips:
                    frames = decode_clips(body, parsed)
                    check_inputs(frames.flatten(0, 1), [p for p in parsed.prompts for _ in range(frames.shape[1])])
                    with locks[name]:  # a clip it fails on is reported, not the request failed
                        scores, failed = score_clips_each(rewards[name], frames, parsed.prompts)
                else:
                    images, prompts = decode_parsed(body, parsed)
                    check_inputs(images, prompts)  # a client's mistake is a 400 whatever the reward checks itself
                    extra = {"sources": decode_sources(body, parsed)} if takes_sources(rewards[name]) else {}
                    with locks[name]:
                        scores = rewards[name](images, prompts, **extra)
        except ServerBusyError as exc:
            return 503, {"detail": str(exc)}
        except WireTooLargeError as exc:
            return 413, {"detail": f"too large: {exc}"}
        except (WireFormatError, RewardInputError) as exc:
            return 400, {"detail": f"bad request: {exc}"}
        except Exception as exc:  # noqa: BLE001 - the server's own failure: the client gets the reason, retries
            log.exception("scoring with %s failed", name)
            return 500, {"detail": f"{name} failed: {type(exc).__name__}: {exc}"}
        return 200, nonfinite_reply(name, scores, failed)

    return score


def build_app(rewards: Mapping[str, Reward], info: Mapping[str, dict] | None = None,
              device: str = "cpu", limits: ServerLimits | None = None, health_details: bool = False):
    """The FastAPI app serving ``rewards`` (name -> reward), behind the token and body limits."""
    fastapi = require("fastapi", "server", "the reward server")
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    limits = limits or ServerLimits()
    app = fastapi.FastAPI(title="flux-grpo reward server", version=fastvideo.__version__)
    records = {n: dict(r) for n, r in (info or {n: {} for n in rewards}).items()}
    for n, record in records.items():
        if not health_details:
            record.pop("files", None)  # file paths tell a stranger about this machine
        if n in rewards and takes_clips(rewards[n]):  # the client must know: clips travel in their own format
            record["takes_clips"] = True
    health = {"status": "ok", "server_version": SERVER_VERSION, "flux_grpo_version": fastvideo.__version__,
              "device": device, "rewards": records,
              "limits": {"max_body_bytes": limits.max_body_bytes, "max_pixels": limits.max_pixels,
                         "max_images": limits.max_images, "max_request_pixels": limits.max_request_pixels,
                         "max_clip_pixels": limits.max_clip_pixels}}
    score = make_scorer(rewards, device, limits)
    inflight, bodies = asyncio.Semaphore(limits.max_inflight), BodyBudget(limits.max_buffered_bytes,
                                                                          limits.stall_timeout_s)

    @app.get("/health")
    def get_health() -> dict:
        return health

    @app.post("/score/{name}")
    async def post_score(name: str, request: Request):
        if name not in rewards:
            return JSONResponse({"detail": f"unknown reward {name!r}; served: {sorted(rewards)}"}, 404)
        try:
            # The body is read before a scoring slot is taken: slow uploads wait on their own
            # clock (read_timeout_s) while ready requests score; the bodies' bytes are bounded.
            async with bodies.body(request, limits) as body, inflight:
                status, reply = await run_in_threadpool(score, name, body)
        except BodyError as exc:  # answered without reading the rest: the connection closes
            return JSONResponse({"detail": exc.detail}, exc.status, headers={"Connection": "close"})
        return JSONResponse(reply, status)

    return GuardMiddleware(app, limits.token)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reward_server", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rewards", default=None, help='rewards to serve, e.g. "hpsv2,pickscore" '
                   "(weights, if given, are ignored: the client weighs)")
    p.add_argument("--plugin", action="append", default=[], metavar="NAME=MODULE:FACTORY",
                   help="also serve FACTORY(device=..., batch_size=...)'s reward as NAME (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept other machines (needs a --token)")
    p.add_argument("--port", type=int, default=8000)
    add_limit_flags(p)
    p.add_argument("--device", default="auto", choices=["auto", "cpu"],
                   help="auto: this machine's accelerator (NPU or GPU) if any, else the CPU")
    p.add_argument("--device_index", type=int, default=0, help="which accelerator")
    p.add_argument("--reward_precision", "--dtype", dest="reward_precision", default="auto",
                   choices=["auto", "fp16", "bf16", "fp32"],
                   help="autocast dtype, as the trainer's --reward_precision: auto = fp16 on an accelerator "
                        "(upstream's HPS scoring), fp32 on the CPU")
    p.add_argument("--batch_size", type=int, default=16, help="images per model call")
    g = p.add_argument_group("reward files (as the trainer's flags)")
    from fastvideo.rewards.weights import default_folder

    g.add_argument("--hps_ckpt_dir", default=default_folder("hpsv2"))
    g.add_argument("--hps_model_name", default="ViT-H-14")
    g.add_argument("--hps_input", default="uint8", choices=["uint8", "float"],
                   help="as the trainer's --hps_input: uint8 scores 8-bit images (upstream's path), float skips "
                        "the rounding; set it to the trainer's value (a trainer's own flag does not reach here)")
    g.add_argument("--pickscore_dir", default=default_folder("pickscore"))
    g.add_argument("--pickscore_processor_dir", default=None)
    g.add_argument("--clip_dir", default=default_folder("clip"))
    add_reward_flags(p, client=False)
    return one_line_errors(p)


class PluginReward:
    """A plugin's callable with the reward contract enforced: inputs checked, [B] float32 out."""

    def __init__(self, name: str, fn, batch_size: int) -> None:
        self.name, self.fn, self.batch_size = name, fn, batch_size
        self.uses_sources = takes_sources(fn)
        self.sources_optional = bool(getattr(fn, "sources_optional", False))  # scores without them too
        self.takes_clips = takes_clips(fn)  # given clips [B, F, 3, H, W] (rewards/video.py)

    def __call__(self, images, prompts, sources=None) -> torch.Tensor:
        if self.takes_clips:
            check_clips(images, len(prompts))
            n = check_inputs(images.flatten(0, 1), [p for p in prompts for _ in range(images.shape[1])])
            n //= images.shape[1]
        else:
            n = check_inputs(images, prompts)
        if self.uses_sources and not (self.sources_optional and sources is None):
            check_sources(sources, n, self.name)
        extra = {"sources": sources} if self.uses_sources else {}
        scores = torch.as_tensor(self.fn(images, list(prompts), **extra)).detach().float().reshape(-1).cpu()
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
    if takes_clips(fn):
        info["takes_clips"] = True
    if takes_sources(fn):
        info["uses_sources"] = True
        if getattr(fn, "sources_optional", False):  # the trainer's pre-flight lets a text-to-image run use it
            info["sources_optional"] = True
    return name.strip(), PluginReward(name.strip(), fn, batch_size), info


def build_rewards(args: argparse.Namespace) -> tuple[dict[str, Reward], dict[str, dict], torch.device]:
    if not args.rewards and not args.plugin:
        raise ValueError("nothing to serve: give --rewards NAMES and/or --plugin NAME=MODULE:FACTORY")
    specs = parse_reward_spec(args.rewards) if args.rewards else []
    remote = [s.name for s in specs if s.url is not None]
    if remote:
        raise RewardSpecError(f"a reward server serves local rewards only; got {remote}")
    device = devices.get_device(args.device_index, "cpu" if args.device == "cpu" else None)
    per = model_reward_kwargs(args, extras_from_args(args))
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


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    d = ServerLimits()
    g = p.add_argument_group("access and limits")
    g.add_argument("--token", default=None, help=f"shared secret the client sends (Authorization: Bearer); "
                   f"default: ${TOKEN_ENV}. Required unless --host is loopback")
    g.add_argument("--max_body_mb", type=float, default=d.max_body_bytes / (1 << 20),
                   help="largest request body (413 above it, refused before it is read)")
    g.add_argument("--max_pixels", type=int, default=d.max_pixels, help="largest image, H*W (413 above it)")
    g.add_argument("--max_images", type=int, default=d.max_images, help="most images per request")
    g.add_argument("--max_request_pixels", type=int, default=d.max_request_pixels,
                   help="most pixels (H*W summed over its images) one request may decode to (413 above it)")
    g.add_argument("--max_clip_pixels", type=int, default=d.max_clip_pixels,
                   help="most frame pixels (F*H*W summed over its clips) one clip request may decode to (413 above it; "
                        "the default holds one 81-frame 480x832 clip)")
    g.add_argument("--max_server_pixels", type=int, default=d.max_server_pixels,
                   help="most decoded pixels all requests hold at once (more wait; 503 after --read_timeout_s)")
    g.add_argument("--max_buffered_mb", type=float, default=d.max_buffered_bytes / (1 << 20),
                   help="most request-body bytes all requests hold at once (503 above it; the client retries)")
    g.add_argument("--max_inflight", type=int, default=d.max_inflight,
                   help="scoring requests read and scored at once (more wait)")
    g.add_argument("--max_connections", type=int, default=d.max_connections,
                   help="open connections before new requests get 503")
    g.add_argument("--max_connections_per_peer", type=int, default=d.max_connections_per_peer,
                   help="at --max_connections, a peer address holding more loses its oldest connection to a newcomer")
    g.add_argument("--read_timeout_s", type=float, default=d.read_timeout_s, help="time for a request body")
    g.add_argument("--stall_timeout_s", type=float, default=d.stall_timeout_s,
                   help="a body silent this long is dropped (408) when --max_buffered_mb needs its room")
    g.add_argument("--header_timeout_s", type=float, default=d.header_timeout_s,
                   help="time for a new connection's request head")
    g.add_argument("--health_details", action="store_true", help="/health also lists the model files loaded")


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """The flags as ServerLimits; ValueError naming a bad flag or a missing token."""
    numbers = {"--max_body_mb": args.max_body_mb, "--max_pixels": args.max_pixels, "--max_images": args.max_images,
               "--max_request_pixels": args.max_request_pixels, "--max_server_pixels": args.max_server_pixels,
               "--max_clip_pixels": args.max_clip_pixels,
               "--max_buffered_mb": args.max_buffered_mb, "--max_inflight": args.max_inflight,
               "--max_connections": args.max_connections, "--read_timeout_s": args.read_timeout_s,
               "--header_timeout_s": args.header_timeout_s, "--max_connections_per_peer": args.max_connections_per_peer,
               "--stall_timeout_s": args.stall_timeout_s}
    bad = [f"{k} {v}" for k, v in numbers.items() if not v > 0]
    if bad:
        raise ValueError(f"{', '.join(bad)}: must be > 0")
    if args.max_request_pixels > args.max_server_pixels:  # such a request could never be scored
        raise ValueError(f"--max_request_pixels {args.max_request_pixels} is over --max_server_pixels "
                         f"{args.max_server_pixels}: a request that large would wait forever")
    if args.max_clip_pixels > args.max_server_pixels:  # such a clip request could never be scored
        raise ValueError(f"--max_clip_pixels {args.max_clip_pixels} is over --max_server_pixels "
                         f"{args.max_server_pixels}: a clip request that large would wait forever")
    if args.max_buffered_mb < args.max_body_mb:
        raise ValueError(f"--max_buffered_mb {args.max_buffered_mb:g} is under --max_body_mb {args.max_body_mb:g}: "
                         f"a body at the size limit could never be read")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} must be in 0..65535")
    token = args.token or os.environ.get(TOKEN_ENV) or None  # "" is no token
    if token is None and not is_loopback(args.host):
        raise ValueError(f"--host {args.host} accepts other machines: give --token SECRET (or set {TOKEN_ENV}) "
                         f"and the same token to the trainer, or bind --host 127.0.0.1")
    return ServerLimits(token=token, max_body_bytes=int(args.max_body_mb * (1 << 20)), max_pixels=args.max_pixels,
                        max_images=args.max_images, max_request_pixels=args.max_request_pixels,
                        max_clip_pixels=args.max_clip_pixels,
                        max_server_pixels=args.max_server_pixels,
                        max_buffered_bytes=int(args.max_buffered_mb * (1 << 20)), max_inflight=args.max_inflight,
                        max_connections=args.max_connections, read_timeout_s=args.read_timeout_s,
                        header_timeout_s=args.header_timeout_s, max_connections_per_peer=args.max_connections_per_peer,
                        stall_timeout_s=args.stall_timeout_s)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        limits = limits_from_args(args)
        uvicorn = require("uvicorn", "server", "the reward server")
        rewards, info, device = build_rewards(args)
    except (UserError, ValueError, OSError, ImportError, RuntimeError) as exc:  # the user's mistake: one line, no traceback
        print(f"reward_server: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = limits.max_pixels  # PIL's own bomb guard, behind the header check
    raise_open_file_limit()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)  # the one line per request
    print(f"[reward_server] serving {', '.join(rewards)} on {device} at http://{args.host}:{args.port}"
          f"{' (token required)' if limits.token else ''}", flush=True)
    app = build_app(rewards, info, str(device), limits, args.health_details)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", **uvicorn_settings(limits))


if __name__ == "__main__":
    main()
