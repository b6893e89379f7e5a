"""Rewards scored by another process or machine: ``remote:`` (our reward server) entries of
``--rewards``, their parsing, the HTTP client and the start-up reachability check.

    --rewards "remote:http://host:8000/hpsv2:1.0,pickscore:0.5"
    --rewards "remote:http://host:8000/hpsv2?encoding=u8:1.0"

The URL's last path segment names the reward the server serves (``GET /health`` lists them);
the number after the last ``:`` is the weight (1.0 when absent). ``encoding`` (f32, u8, png; see
rewards/wire.py) sets how images travel; f32, the default, gives bit-identical scores.
``token`` is the server's shared secret (``--token``), sent as ``Authorization: Bearer TOKEN``;
without it the client sends ``$FLUX_GRPO_REWARD_TOKEN`` when set (preferred: a URL may be logged).

The client splits a call into requests of at most ``batch_size`` images, waits ``timeout_s`` for
each and retries a failed one ``retries`` times with exponential backoff (0.5 s, 1 s, 2 s...)
before raising :class:`RemoteRewardError` naming the URL. A 4xx answer (unknown reward, bad
request, wrong token, too large) is not retried: it would fail again. A score the server reports
non-finite (JSON has no NaN: it sends null and lists the index under "nonfinite") comes back as
NaN, which :class:`fastvideo.rewards.combine.MultiReward` drops from its group, logs naming the
reward, and counts (``rewards/nonfinite_dropped``).
"""

from __future__ import annotations

import os
import sys
import urllib.error
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import parse_qs, urlsplit, urlunsplit

import torch

from fastvideo.rewards.base import ImageBatch, check_inputs
from fastvideo.rewards.http import EndpointError, RemoteRewardError, call_with_retries, error_text, http_json
from fastvideo.rewards.wire import ENCODINGS, encode_request

ENDPOINT_KINDS = ("remote", "vlm")
TOKEN_ENV = "FLUX_GRPO_REWARD_TOKEN"


@dataclass(frozen=True)
class Endpoint:
    """A parsed remote:/vlm: entry: kind, URL (without the weight) and its reward name."""

    kind: str
    url: str
    name: str


def split_endpoint_item(item: str) -> tuple[Endpoint, float | None]:
    """``"remote:http://h:8000/hpsv2:0.5"`` -> (Endpoint, 0.5); weight None when not given.

    One entry may list several servers of one reward joined with ``|``
    (``vlm:http://a/v1?model=M|http://b/v1?model=M:0.25``): data-parallel rank r asks server
    r mod n (training.builders.rank_reward_specs).

    The trailing ``:number`` is a weight only if what stays before it is still a URL with a path
    (``remote:http://h:8000`` keeps 8000 as its port and then fails for lack of a reward name).
    """
    kind, _, rest = item.partition(":")
    head, sep, tail = rest.rpartition(":")
    weight = None
    if sep and "://" in head and urlsplit(head).path not in ("", "/"):
        try:
            weight = float(tail)
            rest = head
        except ValueError:
            pass
    url = rest.strip()
    names = {_endpoint_name(kind, one) for one in url.split("|")}
    if len(names) > 1:
        raise ValueError(f"{kind}: the servers of one entry ({url!r}, joined with |) must serve one reward; "
                         f"they name {sorted(names)}")
    return Endpoint(kind, url, names.pop()), weight


def _endpoint_name(kind: str, url: str) -> str:
    """The reward one remote:/vlm: server URL names (ValueError naming the problem)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{kind}: needs an http(s) URL, e.g. {kind}:http://host:8000/...; got {url!r}")
    if kind == "remote":
        name = parts.path.rstrip("/").rsplit("/", 1)[-1]
        if not name:
            raise ValueError(
                f"remote: URL {url!r} names no reward; append the served reward's name, e.g. "
                f"remote:{url.rstrip('/')}/hpsv2 (GET {url.rstrip('/')}/health lists them)")
        encoding = parse_qs(parts.query).get("encoding", ["f32"])[-1]
        if encoding not in ENCODINGS:
            raise ValueError(f"remote: URL {url!r}: encoding must be one of {ENCODINGS}")
        return name
    query = parse_qs(parts.query)
    if not query.get("model"):
        raise ValueError(f"vlm: URL {url!r} needs ?model=NAME (the served model's name)")
    return "vlm/" + query["model"][-1]


def server_base(url: str) -> tuple[str, str, str]:
    """remote: URL -> (server base URL, reward name, encoding)."""
    parts = urlsplit(url)
    path, _, name = parts.path.rstrip("/").rpartition("/")
    encoding = parse_qs(parts.query).get("encoding", ["f32"])[-1]
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")), name, encoding


def auth_headers(url: str) -> dict[str, str]:
    """The Authorization header for a remote: URL: its ``token=``, else $FLUX_GRPO_REWARD_TOKEN, else none."""
    token = parse_qs(urlsplit(url).query).get("token", [os.environ.get(TOKEN_ENV, "")])[-1]
    return {"Authorization": f"Bearer {token}"} if token else {}


def redact(url: str) -> str:
    """The URL with a ``token=`` value hidden, for messages and logs."""
    parts = urlsplit(url)
    query = "&".join("token=***" if q.startswith("token=") else q for q in parts.query.split("&"))
    return urlunsplit(parts._replace(query=query))


def check_reward_server(url: str, timeout_s: float = 10.0) -> dict:
    """GET <server>/health and check that it serves the URL's reward; its health record.
    EndpointError (a user error: one line, exit 2) naming the server otherwise."""
    base, name, _ = server_base(url)
    try:
        health = http_json(f"{base}/health", timeout_s=timeout_s, headers=auth_headers(url))
    except urllib.error.HTTPError as exc:
        if exc.code != 401:
            raise EndpointError(f"reward server {base} answered /health with {error_text(exc)}") from None
        raise EndpointError(
            f"reward server {base} refused the token: {error_text(exc)}. Give the server's --token as "
            f"{TOKEN_ENV}=... or remote:{base}/{name}?token=...") from None
    except (urllib.error.URLError, OSError, TimeoutError, ValueError,  # BadReplyError is a ValueError
            RemoteRewardError) as exc:  # http.ReplyLimitError: /health dripped past its deadline
        raise EndpointError(
            f"reward server {base} (from --rewards remote:{redact(url)}) does not answer: "
            f"{error_text(exc)}. Start it first: python -m fastvideo.tools.reward_server "
            f"--rewards {name} --host HOST --port PORT"
        ) from None
    served = health.get("rewards")
    if not isinstance(served, dict) or not all(isinstance(v, dict) for v in served.values()):
        raise EndpointError(f"{base}/health answered {health!r:.200}, not a flux-grpo reward server's health "
                            f"record: is {base} the reward server?")
    if name not in served:
        raise EndpointError(f"reward server {base} does not serve {name!r}; it serves {sorted(served)}")
    limits = health.get("limits")
    return {**served[name], "limits": limits if isinstance(limits, dict) else {}}


def scores_from_reply(reply: dict, count: int, what: str) -> torch.Tensor:
    """``{"scores": [count numbers or nulls]}`` -> float32 [count], NaN for null (the server's
    non-finite scores). Anything else -- true/false (JSON booleans would pass as 1.0/0.0), strings,
    a wrong count -- is RemoteRewardError naming ``what``: a run must not train on made-up rewards."""
    values = reply.get("scores")
    if not isinstance(values, list) or len(values) != count:
        raise RemoteRewardError(f"{what} answered {reply!r:.200} for {count} images")
    bad = [v for v in values if v is not None and type(v) not in (int, float)]  # type(): bool is an int subclass
    if bad:
        raise RemoteRewardError(f"{what} answered non-numeric scores {bad!r:.200} (real numbers or null only)")
    try:
        return torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float32)
    except OverflowError:  # an int beyond any float
        raise RemoteRewardError(f"{what} answered scores out of range {values!r:.200}") from None


class RemoteReward:
    """A reward computed by ``python -m fastvideo.tools.reward_server``; same call and output
    as the in-process reward: ``reward(images, prompts) -> float32 [B]`` on CPU.

    Editing: when the server's /health record says the served reward ``uses_sources``, this client
    takes ``sources=`` too (rewards.base.takes_sources) and sends them in the request (the wire
    format's optional "sources"); to any other reward, and to a server that predates sources, it
    sends the request as before."""

    def __init__(self, url: str, timeout_s: float = 120.0, retries: int = 3, batch_size: int = 32,
                 check: bool = True) -> None:
        self.url = url
        self.base, self.name, self.encoding = server_base(url)
        if not (timeout_s > 0 and retries >= 0 and batch_size >= 1):
            raise ValueError(f"bad client settings: timeout_s={timeout_s}, retries={retries}, "
                             f"batch_size={batch_size}")
        self.timeout_s, self.retries, self.batch_size = timeout_s, retries, batch_size
        self.headers = auth_headers(url)
        self.info = check_reward_server(url, timeout_s=min(timeout_s, 10.0)) if check else {}
        self.uses_sources = self.info.get("uses_sources") is True
        self.sources_optional = self.info.get("sources_optional") is True  # rewards.base.needs_sources
        self.takes_clips = self.info.get("takes_clips") is True  # rewards.video: given whole clips

    def _request(self, images: ImageBatch, prompts: list[str], sources: torch.Tensor | None = None) -> torch.Tensor:
        """Scores of one request [b] float32, NaN where the server's reward was non-finite."""
        body = encode_request(images, prompts, self.encoding, sources)
        return scores_from_reply(self._post(body, len(prompts), "images", ", send ?encoding=u8,"), len(prompts),
                                 self._what)

    @property
    def _what(self) -> str:
        return f"reward server {self.base} ({self.name})"

    def _post(self, body: bytes, count: int, unit: str, hint: str = "") -> dict:
        """The server's JSON reply to one scoring request of ``count`` images or clips, retried."""
        what = self._what
        limit = self.info.get("limits", {}).get("max_body_bytes")
        if limit is not None and len(body) > limit:  # the server would answer 413 (or reset mid-upload)
            raise RemoteRewardError(
                f"a request of {count} {unit} is {len(body)} bytes, over {what}'s limit of {limit} "
                f"(its --max_body_mb): lower --reward_batch_size{hint} or raise --max_body_mb")
        return call_with_retries(
            what, lambda seconds: http_json(f"{self.base}/score/{self.name}", body, seconds, headers=self.headers,
                                            max_bytes=reply_cap(count)),
            self.retries, timeout_s=self.timeout_s)

    def __call__(self, images: ImageBatch, prompts: Sequence[str], sources: torch.Tensor | None = None) -> torch.Tensor:
        if self.takes_clips:
            return self._score_clips(images, list(prompts))
        n = check_inputs(images, prompts)
        prompts = list(prompts)
        if not self.uses_sources:
            sources = None  # a reward that does not use them (or an older server) gets the request as before
        size = self.batch_size
        return torch.cat([self._request(images[i:i + size], prompts[i:i + size],
                                        None if sources is None else sources[i:i + size])
                          for i in range(0, n, size)])

    def _score_clips(self, clips: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """Scores [B] of clips [B, F, 3, H, W] (u8 on the wire unless the URL says encoding=f32), in
        requests of at most ``batch_size`` clips and of the server's ``max_clip_pixels``; NaN for a
        clip the server failed on (its reply's "failed"), which the trainer drops."""
        from fastvideo.rewards.video import check_clips

        check_clips(clips, len(prompts))
        check_inputs(clips.flatten(0, 1), [p for p in prompts for _ in range(clips.shape[1])])
        b, f, _, h, w = clips.shape
        size = self.batch_size
        cap = self.info.get("limits", {}).get("max_clip_pixels")
        if isinstance(cap, int):
            if f * h * w > cap:
                raise RemoteRewardError(
                    f"a clip of {f} frames of {w}x{h} is {f * h * w} frame pixels, over reward server {self.base}'s "
                    f"limit of {cap} (its --max_clip_pixels): raise it there, or send fewer frames or smaller ones")
            size = max(1, min(size, cap // (f * h * w)))
        return torch.cat([self._clip_request(clips[i:i + size], prompts[i:i + size]) for i in range(0, b, size)])

    def _clip_request(self, clips: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        from fastvideo.rewards.clip_wire import encode_clip_request

        explicit = parse_qs(urlsplit(self.url).query).get("encoding", [None])[-1]
        body = encode_clip_request(clips, prompts, "f32" if explicit == "f32" else "u8")
        reply = self._post(body, len(prompts), "clips")
        what = self._what
        scores = scores_from_reply(reply, len(prompts), what)
        failed = reply.get("failed")
        if failed:
            print(f"[warning] {what} could not score clip(s) {failed!r:.80} of a request of {len(prompts)}: "
                  f"{reply.get('errors')!r:.300}; dropped from their groups (never scored 0)", file=sys.stderr,
                  flush=True)
            if not isinstance(failed, list) or any(type(i) is not int or not 0 <= i < len(prompts) or
                                                   not torch.isnan(scores[i]) for i in failed):
                raise RemoteRewardError(f"{what} listed failed clips {failed!r:.100} that do not match its scores")
        return scores

    def __repr__(self) -> str:
        return f"RemoteReward({redact(self.url)!r}, batch_size={self.batch_size})"


def reply_cap(n: int) -> int:
    """The most bytes a reward server's answer for ``n`` images may take: its JSON scores (a float
    written out is under 32 characters), the reward's name and the server's record, with a MiB of room
    (a proxy's error page)."""
    return (1 << 20) + 64 * n


def served_needs_sources(info: dict) -> bool:
    """Whether a served reward's /health record says it cannot score without source images: it
    ``uses_sources`` and does not say ``sources_optional`` (rewards.base.needs_sources, over the wire)."""
    return info.get("uses_sources") is True and info.get("sources_optional") is not True


def check_reward_endpoints(specs, timeout_s: float = 10.0) -> list[tuple[object, dict]]:
    """Fail fast, naming the URL, when a remote:/vlm: entry of --rewards does not answer; the
    remote entries' (spec, /health record) pairs otherwise.

    The trainer calls this before it loads any model, so a typo in a URL costs seconds."""
    served = []
    for spec in specs:
        if getattr(spec, "kind", "local") == "remote":
            served.append((spec, check_reward_server(spec.url, timeout_s)))
        elif getattr(spec, "kind", "local") == "vlm":
            from fastvideo.rewards.vlm import check_vlm_endpoint

            check_vlm_endpoint(spec.url, timeout_s)
    return served
