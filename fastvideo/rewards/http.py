"""The HTTP client under remote: and vlm: rewards: one JSON request, error text, retries.

Its own module so that rewards/remote.py (our reward server) and rewards/vlm.py (OpenAI-compatible
judges) share it without importing each other. A failed call is retried ``retries`` times with
exponential backoff (0.5 s, 1 s, 2 s...) before :class:`RemoteRewardError` names the endpoint; a
4xx answer (unknown reward, bad request, wrong token, too large) is the client's mistake and is
never retried: it would fail again. A 5xx answer, a connection error and a garbled reply (not
JSON, cut short, a bad status line: a proxy or a dying server) always are; a well-formed reply of
the wrong shape (a JSON list where an object belongs) is not: the endpoint speaks another protocol.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request

from fastvideo.errors import UserError

# The retry warnings keep the logger name they had before this module was split out of remote.py,
# so log filters (and tests' caplog) written against it still see them.
log = logging.getLogger("fastvideo.rewards.remote")


class RemoteRewardError(RuntimeError):
    """A reward server or judge endpoint that cannot be reached or keeps failing."""


class EndpointError(RemoteRewardError, UserError):
    """A remote:/vlm: endpoint that fails its start-up check (does not answer, refuses the token,
    does not serve the reward): the user's to fix before the run, reported as one line (exit 2)."""


class BadReplyError(ValueError):
    """A reply that is not the JSON object asked for; ``transient`` when a retry may get a good one."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


# The most a reply may hold unless the caller knows better (a judge's chat completion, /health):
# a server that never stops sending is cut off here instead of filling the trainer's memory.
MAX_REPLY_BYTES = 4 << 20


class ReplyLimitError(RemoteRewardError):
    """A reply over its size cap or past its deadline: the endpoint is broken or hostile, and a
    retry would only wait or read as long again (never retried)."""


class ReplyTooLargeError(ReplyLimitError):
    """A reply over its size cap."""


def read_bounded(reply, max_bytes: int, deadline: float, what: str = "the reply") -> bytes:
    """The body of ``reply`` (an http.client.HTTPResponse) read one socket read at a time, refusing
    it once it passes ``max_bytes`` or time.monotonic() passes ``deadline`` (a server that drips its
    reply byte by byte would otherwise reset the socket timeout at every byte)."""
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise ReplyLimitError(f"{what} was still arriving at its deadline ({size} bytes so far): the server "
                                  "drips its reply; raise --reward_timeout if it is only slow")
        chunk = reply.read1(65536)
        if not chunk:
            if reply.length:  # closed before its Content-Length: what read() reports as IncompleteRead
                raise http.client.IncompleteRead(b"".join(chunks), reply.length)
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise ReplyTooLargeError(f"{what} passed {max_bytes} bytes, more than its answer can hold: the server "
                                  "sends without end (is this URL a flux-grpo reward server?)")
        chunks.append(chunk)


class _Watchdog:
    """Shuts down every socket a request opened once ``deadline`` (time.monotonic()) passes, so a
    server that drips its status line, headers or body, or reads the upload byte by byte, cannot hold
    the request past it: each byte would reset the socket timeout, this does not wait for any byte."""

    def __init__(self, deadline: float) -> None:
        self.expired, self.sockets, self.lock = False, [], threading.Lock()
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self.fire)
        self.timer.daemon = True

    def watch(self, sock):
        with self.lock:
            self.sockets.append(sock)
            if self.expired:
                self._shut(sock)
        return sock

    def fire(self) -> None:
        with self.lock:
            self.expired = True
            for sock in self.sockets:
                self._shut(sock)

    @staticmethod
    def _shut(sock) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes a recv()/send() blocked in another thread
        except OSError:
            pass

    def opener(self) -> urllib.request.OpenerDirector:
        """urllib's opener (proxies, redirects as urlopen has them) whose connections report their sockets."""
        watch = self.watch

        def watched(cls):
            def connection(host, **kw):
                conn = cls(host, **kw)
                create = conn._create_connection
                conn._create_connection = lambda *a, **k: watch(create(*a, **k))
                return conn
            return connection

        class Watched:
            def do_open(self, http_class, req, **kw):
                return super().do_open(watched(http_class), req, **kw)

        class Http(Watched, urllib.request.HTTPHandler):
            pass

        class Https(Watched, urllib.request.HTTPSHandler):
            pass

        return urllib.request.build_opener(Http, Https)


def http_json(url: str, body: bytes | None = None, timeout_s: float = 10.0,
              content_type: str = "application/octet-stream", headers: dict[str, str] | None = None,
              max_bytes: int = MAX_REPLY_BYTES) -> dict:
    """GET (body None) or POST ``url`` with extra ``headers``; the JSON object replied, whole within
    ``timeout_s`` of wall-clock time (connecting, sending, status line, headers and body together) and
    at most ``max_bytes``. Raises urllib's errors as they come, ReplyLimitError for a reply over either
    bound, and BadReplyError for a garbled reply or one that is not a JSON object."""
    request = urllib.request.Request(url, data=body, method="GET" if body is None else "POST", headers=headers or {})
    if body is not None:
        request.add_header("Content-Type", content_type)
    deadline = time.monotonic() + timeout_s
    watchdog = _Watchdog(deadline + 0.1 + 0.05 * timeout_s)  # after a silent server's socket timeout (retried)
    watchdog.timer.start()
    try:
        with watchdog.opener().open(request, timeout=timeout_s) as reply:
            status, raw = reply.status, read_bounded(reply, max_bytes, deadline, f"the reply of {url}")
    except Exception as exc:  # noqa: BLE001 - what a shut socket raises depends on where it was
        if not watchdog.expired or isinstance(exc, ReplyTooLargeError):
            if isinstance(exc, http.client.HTTPException):  # a bad status line, a body cut short: not OSErrors
                raise BadReplyError(f"garbled reply ({type(exc).__name__}: {str(exc).strip()[:100]!r})",
                                    transient=True) from None
            raise
    finally:
        watchdog.timer.cancel()
    if watchdog.expired:  # whatever the shut socket made of the reply (no headers, a cut body) is not it
        raise ReplyLimitError(f"the reply of {url} was still arriving at its deadline of {timeout_s:g} s (the "
                              "server drips or stalls it); raise --reward_timeout if it is only slow")
    try:
        value = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BadReplyError(f"HTTP {status} reply that is not JSON ({len(raw)} bytes: {raw[:80]!r})",
                            transient=True) from None
    if not isinstance(value, dict):
        raise BadReplyError(f"HTTP {status} reply that is a JSON {type(value).__name__}, not an object: "
                            f"{raw[:80]!r}", transient=False)
    return value


def error_text(exc: Exception) -> str:
    """One line about a failed request: the HTTP status and body start, or the socket error."""
    if isinstance(exc, urllib.error.HTTPError):
        try:
            detail = exc.read().decode("utf-8", "replace")[:500]
        except Exception:  # noqa: BLE001 - the status line is enough then
            detail = ""
        text = f"HTTP {exc.code} {exc.reason} {detail}"
    else:
        reason = getattr(exc, "reason", None)
        text = f"{type(exc).__name__}: {reason if reason is not None else exc}"
    return " ".join(text.split())  # a reply's own line breaks must not break the one-line message


def retry_total(timeout_s: float, retries: int, backoff_s: float = 0.5) -> float:
    """The retry policy's total: ``retries + 1`` requests of ``timeout_s`` each and the backoffs between
    them, the longest a call of call_with_retries may take."""
    return timeout_s * (retries + 1) + sum(backoff_s * 2 ** k for k in range(retries))


def call_with_retries(what: str, fn, retries: int, backoff_s: float = 0.5, timeout_s: float | None = None,
                      total_s: float | None = None):
    """fn() with up to ``retries`` retries after connection errors, timeouts, 5xx answers and
    garbled replies; RemoteRewardError naming ``what`` at once for a 4xx or a reply of the wrong shape.

    With ``timeout_s`` (a request's deadline) fn is called as fn(seconds), each try given the smaller of
    ``timeout_s`` and what is left of ``total_s`` (default retry_total): no try and no backoff starts
    past the total, so a call ends within it whatever the server does."""
    total = None if timeout_s is None else (total_s if total_s is not None else retry_total(timeout_s, retries, backoff_s))
    deadline = None if total is None else time.monotonic() + total
    for attempt in range(retries + 1):
        try:
            return fn() if deadline is None else fn(min(timeout_s, max(deadline - time.monotonic(), 0.001)))
        except ReplyLimitError as exc:
            raise RemoteRewardError(f"{what}: {exc}") from None
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise RemoteRewardError(f"{what} refused the request: {error_text(exc)}") from None
            last = exc
        except BadReplyError as exc:
            if not exc.transient:
                raise RemoteRewardError(f"{what} sent an {exc}; is this URL a flux-grpo reward server "
                                        f"(or the judge's OpenAI-compatible API)?") from None
            last = exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            last = exc
        if attempt < retries:
            delay = backoff_s * 2 ** attempt
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise RemoteRewardError(
                    f"{what} failed {attempt + 1} times and the retry policy's total of {total:g} s leaves no "
                    f"time for another, last: {error_text(last)} (raise --reward_timeout / --reward_retries "
                    "for a slow server)")
            log.warning("%s failed (%s); retry %d/%d in %.1f s", what, error_text(last),
                        attempt + 1, retries, delay)
            time.sleep(delay)
    raise RemoteRewardError(
        f"{what} failed {retries + 1} times, last: {error_text(last)}. Is the server still "
        "running and reachable from here? (raise --reward_timeout / --reward_retries for a slow one)"
    )
