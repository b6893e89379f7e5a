"""Run a reward server (an ASGI app) on 127.0.0.1 in a thread of the test process."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app, port: int | None = None, timeout_s: float = 20.0, settings: dict | None = None):
    """Yields (base URL, uvicorn.Server); set server.should_exit to stop it early.

    ``settings``: more uvicorn.Config keywords (the server's uvicorn_settings(limits))."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **(settings or {})))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout_s)
