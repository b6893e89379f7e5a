"""The HTTP client under remote: and vlm: rewards: one JSON request, error text, retries.

Its own module so that rewards/remote.py (our reward server) and rewards/vlm.py (OpenAI-compatible
judges) share it without importing each other. A failed call is retried ``retries`` times with
exponential backoff (0.5 s, 1 s, 2 s...) before :class:`RemoteRewardError` names the endpoint; a
4xx answer (unknown reward, bad request, wrong token, too large) is the client's mistake and is
never retried: it would fail again. A 5xx answer or a connection error always is.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

# The retry warnings keep the logger name they had before this module was split out of remote.py,
# so log filters (and tests' caplog) written against it still see them.
log = logging.getLogger("fastvideo.rewards.remote")


class RemoteRewardError(RuntimeError):
    """A reward server or judge endpoint that cannot be reached or keeps failing."""


def http_json(url: str, body: bytes | None = None, timeout_s: float = 10.0,
              content_type: str = "application/octet-stream", headers: dict[str, str] | None = None) -> dict:
    """GET (body None) or POST ``url`` with extra ``headers``; the JSON reply. Raises urllib errors as they come."""
    request = urllib.request.Request(url, data=body, method="GET" if body is None else "POST", headers=headers or {})
    if body is not None:
        request.add_header("Content-Type", content_type)
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        return json.loads(reply.read().decode("utf-8"))


def error_text(exc: Exception) -> str:
    """One line about a failed request: the HTTP status and body start, or the socket error."""
    if isinstance(exc, urllib.error.HTTPError):
        try:
            detail = exc.read().decode("utf-8", "replace")[:500]
        except Exception:  # noqa: BLE001 - the status line is enough then
            detail = ""
        return f"HTTP {exc.code} {exc.reason} {detail}".strip()
    reason = getattr(exc, "reason", None)
    return f"{type(exc).__name__}: {reason if reason is not None else exc}"


def call_with_retries(what: str, fn, retries: int, backoff_s: float = 0.5):
    """fn() with up to ``retries`` retries after connection errors, timeouts and 5xx answers."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise RemoteRewardError(f"{what} refused the request: {error_text(exc)}") from None
            last = exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            last = exc
        if attempt < retries:
            delay = backoff_s * 2 ** attempt
            log.warning("%s failed (%s); retry %d/%d in %.1f s", what, error_text(last),
                        attempt + 1, retries, delay)
            time.sleep(delay)
    raise RemoteRewardError(
        f"{what} failed {retries + 1} times, last: {error_text(last)}. Is the server still "
        "running and reachable from here? (raise --reward_timeout / --reward_retries for a slow one)"
    )
