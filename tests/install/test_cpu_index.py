"""env_setup.sh --target cpu takes torch's CPU build where PyTorch's CPU index answers
(scripts/install_plan.py cpu_index_args), and PyPI's build where it does not."""

from __future__ import annotations

import http.server
import subprocess
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


def _setup_cpu(venv: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "env_setup.sh"), "--target", "cpu", "--venv", str(venv)],
                          env=env, capture_output=True, text=True, timeout=120)


def test_env_setup_without_cpu_index_installs_pypi_torch(env):
    """A fresh machine where the CPU index does not answer: torch from the package index, and no empty
    argument reaches pip (a blank probe line once made bash stop on CPU_INDEX[1])."""
    venv, e, log = env
    e["FLUX_GRPO_CPU_INDEX"] = "0"
    r = _setup_cpu(venv, e)
    assert r.returncode == 0, r.stderr
    assert "CPU index is not reachable" in r.stdout
    first = (Path(str(log) + ".args")).read_text().splitlines()[0]
    assert first == "[install][--disable-pip-version-check][torch>=2.7.1,<2.15][torchvision>=0.22.1]"
    assert "env_setup.sh: ok - torch" in r.stdout


def test_env_setup_with_cpu_index_adds_it(env):
    venv, e, log = env
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/whl/cpu"
        e["FLUX_GRPO_CPU_INDEX"] = url
        r = _setup_cpu(venv, e)
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stderr
    assert f"torch's CPU build from {url}" in r.stdout
    first = (Path(str(log) + ".args")).read_text().splitlines()[0]
    assert first.endswith(f"[torchvision>=0.22.1][--extra-index-url][{url}]")
