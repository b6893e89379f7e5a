"""The reward server's defences: token, size limits, timeouts, request log (tools/reward_server.py).

A reward server may listen beyond loopback (``--host 0.0.0.0``), so every request is treated as
untrusted until proven otherwise:

- ``Authorization: Bearer TOKEN`` checked in constant time (401), when the server has a token;
- the body's Content-Length checked before one byte of it is read and the running count checked
  while it streams in (413); a body that does not arrive within ``read_timeout_s`` gets 408;
- bodies are read before a scoring slot is taken (a crowd of slow uploads cannot hold the slots
  honest requests need), with the bytes all bodies hold at once bounded (``max_buffered_bytes``:
  503 past it, which the client retries);
- decoded pixels bounded per image, per request and for the whole server (``max_server_pixels``:
  a request waits for room, 503 after ``read_timeout_s``), so a small body of compressed images
  cannot decode into gigabytes;
- a connection that has not sent a full request head within ``header_timeout_s`` is closed, so
  half-sent requests cannot pile up until the process runs out of file descriptors;
- one log line per request (method, path, status, body bytes, ms) and at most one "out of file
  descriptors" accept error per minute (asyncio logs one per failed accept otherwise).

Imported only by the server (it needs starlette/uvicorn, installed with ``.[server]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import threading
import time
from dataclasses import dataclass

TOKEN_ENV = "FLUX_GRPO_REWARD_TOKEN"
log = logging.getLogger("fastvideo.tools.reward_server")


@dataclass(frozen=True)
class ServerLimits:
    """What one request, and all of them together, may cost the server. The body limit fits the
    trainer's default request (--reward_batch_size 8) of f32 images up to 1024x1024 (96 MiB) with
    room to spare; the per-request pixel limit is 16 such images (or one of the largest)."""

    token: str | None = None
    max_body_bytes: int = 128 << 20
    max_pixels: int = 4096 * 4096
    max_images: int = 256
    max_request_pixels: int = 4096 * 4096
    max_clip_pixels: int = 2 * 4096 * 4096  # frames x pixels of a clip request: one 81-frame 480x832 clip
    max_server_pixels: int = 2 * 4096 * 4096
    max_buffered_bytes: int = 512 << 20
    max_inflight: int = 4
    max_connections: int = 512
    max_connections_per_peer: int = 64
    read_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    stall_timeout_s: float = 5.0


class BodyError(Exception):
    """A body the server will not read to the end: ``status`` is 413 or 408."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def is_loopback(host: str) -> bool:
    """True for hosts only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def token_matches(header: str | None, token: str) -> bool:
    """``Authorization`` header value == ``Bearer <token>``, compared in constant time."""
    given = (header or "").encode("utf-8", "replace")
    return hmac.compare_digest(given, f"Bearer {token}".encode("utf-8"))


def declared_length(headers) -> int | None:
    """The Content-Length header as an int; None when absent; BodyError(400) when not a number."""
    value = headers.get("content-length")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise BodyError(400, f"bad Content-Length {value!r:.40}")
    return int(value)


async def read_limited_body(request, limits: ServerLimits, take=None, evicted: asyncio.Event | None = None) -> bytes:
    """The request body, refused (BodyError 413) past ``limits.max_body_bytes`` - from the declared
    length before reading, else as soon as the streamed count passes it - or 408 after
    ``read_timeout_s``, or 408 once ``evicted`` is set (BodyBudget: a stalled body's room is
    needed). ``take(n)``, when given, is told of each chunk's bytes as it arrives (and may refuse it
    by raising BodyError)."""
    size = declared_length(request.headers)
    if size is not None and size > limits.max_body_bytes:
        raise BodyError(413, f"request body of {size} bytes is over this server's limit of "
                             f"{limits.max_body_bytes} bytes (--max_body_mb); send fewer images per request")

    async def collect() -> bytes:
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limits.max_body_bytes:
                raise BodyError(413, f"request body over this server's limit of {limits.max_body_bytes} bytes")
            if take is not None:
                take(len(chunk))
            chunks.append(chunk)
        return b"".join(chunks)

    from starlette.requests import ClientDisconnect

    try:
        return await asyncio.wait_for(_unless(collect(), evicted), limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise BodyError(408, f"request body not received within {limits.read_timeout_s} s") from None
    except ClientDisconnect:  # the client left mid-upload: one log line (499), not a server traceback
        raise BodyError(499, "client closed the connection before its body arrived") from None


async def _unless(work, evicted: asyncio.Event | None):
    """``await work``, abandoned (BodyError 408) once ``evicted`` is set."""
    if evicted is None:
        return await work
    task, stop = asyncio.ensure_future(work), asyncio.ensure_future(evicted.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise BodyError(408, "request body stalled while others needed its room (--stall_timeout_s): "
                                 "it was dropped; send it at a steady pace")
        return task.result()
    finally:
        for pending in (task, stop):
            pending.cancel()


class ServerBusyError(Exception):
    """The server cannot take this request now (memory budget in use); the client retries (503)."""


class PixelBudget:
    """Decoded pixels held by all requests at once, at most ``limit``. Scoring threads reserve a
    request's pixels before decoding it and give them back once it is scored."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, pixels: int, wait_s: float):
        """Reserve ``pixels`` for the ``with`` block, waiting up to ``wait_s`` for room
        (ServerBusyError after it)."""
        with self._cond:
            if pixels > self.limit or not self._cond.wait_for(lambda: self.used + pixels <= self.limit, wait_s):
                raise ServerBusyError(f"server busy: {self.used} of its {self.limit} pixels (--max_server_pixels) "
                                      f"are being scored; retry later")
            self.used += pixels
        try:
            yield
        finally:
            with self._cond:
                self.used -= pixels
                self._cond.notify_all()


class BodyBudget:
    """Request-body bytes held in memory by all requests at once, at most ``limit``. Counted as
    bytes arrive (a slow upload that declares a large body holds only what it has sent), given
    back when the request is answered. When a chunk does not fit, the bodies that have sent nothing
    for ``stall_s`` are dropped (408) to make room, least recently active first: a few stalled
    uploads cannot keep everyone at 503 until their read timeout. Used from the event loop only: no lock."""

    def __init__(self, limit: int, stall_s: float = float("inf")) -> None:
        self.limit, self.stall_s, self.used = limit, stall_s, 0
        self.readers: dict = {}  # id -> [bytes held, time of the last chunk, eviction event]

    def _make_room(self, n: int) -> None:
        now = time.monotonic()
        stalled = sorted((r for r in self.readers.values() if now - r[1] > self.stall_s and not r[2].is_set()),
                         key=lambda r: r[1])
        for reader in stalled:
            if self.used + n <= self.limit:
                break
            reader[2].set()  # its read ends with 408; its bytes are counted out here, now
            self.used -= reader[0]
            reader[0] = 0
        dropped = sum(r[2].is_set() for r in stalled)
        if dropped:
            log.warning("body budget full: dropped %d upload(s) stalled over %g s", dropped, self.stall_s)

    @contextlib.asynccontextmanager
    async def body(self, request, limits: "ServerLimits"):
        """``async with budget.body(request, limits) as body``: the body, read within the limits
        (BodyError 413/408, or 503 when the budget is spent), its bytes held until the block ends."""
        me = [0, time.monotonic(), asyncio.Event()]
        self.readers[id(me)] = me

        def take(n: int) -> None:
            me[1] = time.monotonic()
            if self.used + n > self.limit:
                self._make_room(n)
            if self.used + n > self.limit:
                raise BodyError(503, f"server busy: {self.used} bytes of request bodies held (--max_buffered_mb "
                                     f"{self.limit / (1 << 20):g}); retry later")
            self.used += n
            me[0] += n

        try:
            body = await read_limited_body(request, limits, take, me[2])
            del self.readers[id(me)]  # read whole: scoring it is not stalling
            yield body
        finally:
            self.readers.pop(id(me), None)
            self.used -= me[0]


class GuardMiddleware:
    """ASGI middleware: the token check (401) and one log line per HTTP request."""

    def __init__(self, app, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, seen = time.perf_counter(), {"status": 0, "bytes": 0}

        async def counting_receive():
            message = await receive()
            seen["bytes"] += len(message.get("body", b""))
            return message

        async def recording_send(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            await send(message)

        try:
            if self.token is not None and not token_matches(_header(scope, b"authorization"), self.token):
                await _send_json(recording_send, 401, b'{"detail": "missing or wrong token: send the header '
                                 b'Authorization: Bearer <the server\'s --token>"}')
            else:
                await self.app(scope, counting_receive, recording_send)
        finally:
            ms = (time.perf_counter() - start) * 1000
            log.info("%s %s %d %d B %.1f ms", scope["method"], scope["path"], seen["status"], seen["bytes"], ms)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _send_json(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def guarded_h11(header_timeout_s: float, per_peer: int | None = None):
    """uvicorn's h11 protocol, closing a connection whose first request head is not complete
    within ``header_timeout_s`` (uvicorn itself waits forever for it), and, when a new connection
    reaches the connection cap (``limit_concurrency``), closing the oldest connection that has not
    sent a request head yet: uvicorn answers 503 to every request while the cap is reached, so
    without this a crowd of half-sent requests would lock out /health and honest clients until
    their heads time out. When every connection carries a request, a peer address holding more than
    ``per_peer`` of them loses its oldest to the newcomer (the one holding most first): a crowd of
    uploads dripping from one address cannot lock the others out. A 503 is then left for when no
    peer holds more than its share."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    headless: dict = {}  # connections without a request head yet, oldest first (dicts keep order)
    peers: dict = {}  # peer address -> its connections, oldest first

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.loop.call_later(header_timeout_s, self._drop_if_no_request)
            if self.limit_concurrency is not None:
                self._make_room(self.limit_concurrency)
            headless[self] = None
            self.peer_host = (transport.get_extra_info("peername") or ("?",))[0]
            peers.setdefault(self.peer_host, {})[self] = None

        def connection_lost(self, exc) -> None:
            headless.pop(self, None)
            mine = peers.get(getattr(self, "peer_host", None), {})
            mine.pop(self, None)
            if not mine:
                peers.pop(getattr(self, "peer_host", None), None)
            super().connection_lost(exc)

        def _waiting(self) -> bool:
            """Connected, and no request head received yet."""
            return self.cycle is None and not self.transport.is_closing()

        def _drop_if_no_request(self) -> None:
            if self._waiting():
                self.transport.close()

        def _make_room(self, cap: int) -> None:
            """Close the oldest head-less connections (not this one) until this one's request fits."""
            closed = 0
            while len(self.connections) >= cap and headless:
                oldest = next(iter(headless))
                del headless[oldest]
                if oldest._waiting():
                    oldest.transport.close()
                    oldest.connections.discard(oldest)  # counted out now; connection_lost follows on the loop
                    closed += 1
            if closed:
                log.warning("connection cap %d reached: closed %d connection(s) that sent no request head",
                            cap, closed)
            if per_peer is not None and len(self.connections) >= cap:
                self._evict_from_heaviest_peer(cap)

        def _evict_from_heaviest_peer(self, cap: int) -> None:
            """Close the oldest connections of the peers over ``per_peer``, the largest first, until
            this one fits."""
            closed = 0
            while len(self.connections) >= cap and peers:
                host, mine = max(peers.items(), key=lambda item: len(item[1]))
                victims = [c for c in mine if c is not self and not c.transport.is_closing()]
                if len(mine) <= per_peer or not victims:
                    break
                oldest = victims[0]
                del mine[oldest]
                oldest.transport.close()
                oldest.connections.discard(oldest)
                closed += 1
            if closed:
                log.warning("connection cap %d reached: closed %d connection(s) of a peer holding over %d "
                            "(--max_connections_per_peer)", cap, closed, per_peer)

    return GuardedH11Protocol


class AcceptErrorFilter(logging.Filter):
    """Lets one asyncio "accept() out of system resource" (or uvicorn "Exceeded concurrency limit", or
    the guard's "connection cap ... reached") record through per ``every_s`` seconds: a flood of connections must not flood the log too."""

    floods = ("out of system resource", "Exceeded concurrency limit", "connection cap", "body budget full")

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s, self.last, self.dropped = every_s, -float("inf"), 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not any(text in str(record.msg) for text in self.floods):
            return True
        now = time.monotonic()
        if now - self.last < self.every_s:
            self.dropped += 1
            return False
        self.last = now
        if self.dropped:
            record.msg = f"{record.msg} (and {self.dropped} more since the last report, not logged)"
        record.exc_info, self.dropped = None, 0
        return True


def uvicorn_settings(limits: ServerLimits) -> dict:
    """uvicorn.Config keywords that bound connections, idle keep-alives and request heads."""
    for name in ("asyncio", "uvicorn.error", log.name):
        logger = logging.getLogger(name)
        if not any(isinstance(f, AcceptErrorFilter) for f in logger.filters):  # one per logger, however many servers
            logger.addFilter(AcceptErrorFilter())
    return {"http": guarded_h11(limits.header_timeout_s, limits.max_connections_per_peer),
            "limit_concurrency": limits.max_connections,
            "timeout_keep_alive": 5, "h11_max_incomplete_event_size": 64 << 10}


def raise_open_file_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (often 1024 -> 1048576): more sockets before EMFILE."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 65536
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, 65536), hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not allowed: keep the limit
        pass
