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


@contextlib.contextmanager
def canned_http_server(reply: bytes, health: bytes | None = None):
    """A loopback server answering every POST with the raw bytes ``reply`` (status line, headers
    and body as given: garbled replies included) and every GET with ``health`` (or ``reply``), then
    closing. Yields (base URL, the request lines received)."""
    import socketserver

    seen: list[str] = []

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data = b""
            self.request.settimeout(10)
            while b"\r\n\r\n" not in data:
                chunk = self.request.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                           if k.strip().lower() == "content-length"), 0)
            while len(body) < length:
                chunk = self.request.recv(65536)
                if not chunk:
                    break
                body += chunk
            seen.append(lines[0])
            self.request.sendall(health if health is not None and lines[0].startswith("GET") else reply)

    with tcp_server(Handler) as url:
        yield url, seen


@contextlib.contextmanager
def tcp_server(handler):
    """A threaded loopback TCP server running ``handler`` (a socketserver.BaseRequestHandler class)
    for each connection; yields its base URL (http://127.0.0.1:PORT)."""
    import socketserver

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
