"""env_setup.sh --target cpu takes torch's CPU build where PyTorch's CPU index answers
(scripts/install_plan.py cpu_index_args), and PyPI's build where it does not."""

from __future__ import annotations

import http.server
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import install_plan  # noqa: E402


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # a package index's page for torch, nothing else
        self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
        self.end_headers()
        self.wfile.write(b"<html></html>")

    def log_message(self, *args):
        pass


def test_reachable_index_is_added_as_extra_index():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/whl/cpu"
        assert install_plan.cpu_index_args(url) == ["--extra-index-url", url]
        # An index without torch (404) is not used.
        assert install_plan.cpu_index_args(f"http://127.0.0.1:{server.server_port}/other") == []
    finally:
        server.shutdown()


def test_unreachable_index_or_switched_off_adds_nothing(monkeypatch):
    with socket_closed_port() as port:
        assert install_plan.cpu_index_args(f"http://127.0.0.1:{port}/whl/cpu", timeout_s=1.0) == []
    monkeypatch.setenv("FLUX_GRPO_CPU_INDEX", "0")
    assert install_plan.cpu_index_args() == []


class socket_closed_port:
    """A local port with nothing listening (bound, then released)."""

    def __enter__(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __exit__(self, *exc):
        return False
