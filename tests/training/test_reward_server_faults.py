"""A reward server that fails after a good start (issue #50 items 7 and 13): it answers garbage
(booleans and strings for scores), refuses the token (401), or stops answering. The run on 2 ranks
under fastvideo.launch ends with one line naming the server, what it did and the last complete
checkpoint, exit 2 (docs/operations.md), no traceback; that checkpoint is intact and resumes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import python_path, train_args
from server_utils import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
GOOD_POSTS = 2  # iteration 1: one request per rank (num_generations 2, one prompt per rank)


def flaky(app, fault: str):
    """The reward server ``app`` for its first GOOD_POSTS scoring requests, then ``fault``:
    'garbage' (HTTP 200 with booleans and a NaN string as scores) or '401'."""
    posts = {"n": 0}

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        posts["n"] += 1
        if posts["n"] <= GOOD_POSTS:
            return await app(scope, receive, send)
        more = True
        while more:  # read the request before answering, as a real server does
            more = (await receive()).get("more_body", False)
        status, body = (200, b'{"scores": [true, "NaN"]}') if fault == "garbage" else (401, b'{"error": "bad token"}')
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return wrapped


@pytest.mark.slow
def test_a_reward_server_failing_mid_run_ends_it_in_one_line_with_the_checkpoint(tiny_flux_dir, tiny_embeddings,
                                                                                 tmp_path):
    from fastvideo.rewards import build_reward
    from fastvideo.tools.reward_server import build_app
    from fastvideo.training.checkpoint import find_latest

    out = tmp_path / "out"
    with serve_in_thread(flaky(build_app({"detail": build_reward("detail")}), "garbage")) as (url, _server):
        argv = train_args(tiny_embeddings, tiny_flux_dir, out, rewards=f"remote:{url}/detail:1.0", max_train_steps=3,
                          checkpointing_steps=1, save_images_every=0, reward_retries=0)
        proc = subprocess.run([sys.executable, "-m", "fastvideo.launch", "--standalone", "--nproc_per_node=2",
                               "fastvideo/train_grpo_flux.py", *argv], capture_output=True, text=True, timeout=600,
                              cwd=ROOT, env={**_env(), "PYTHONPATH": python_path(ROOT)})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("+ torchrun")]  # the echo
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-4000:]
    latest = find_latest(str(out))
    assert latest is not None and Path(latest).name == "checkpoint-1", latest
    assert "non-numeric scores" in lines[0] and url in lines[0] and f"the last complete checkpoint is {latest}" in lines[0], lines[0]
    assert "--resume_from_checkpoint latest" in lines[0]


def _env() -> dict:
    import os

    return dict(os.environ, FASTVIDEO_DEVICE="cpu", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


@pytest.mark.parametrize("rank", [0, 1])
def test_a_mid_run_reward_failure_is_one_line_from_the_rank_that_met_it(rank, tmp_path, capsys, monkeypatch):
    """A 401 after a good start, or a server gone (what the client raises after its retries): a
    ServiceError naming the last complete checkpoint, printed by rank 0 and by any other rank that
    met it (a rank's request can fail alone), exit 2; a start-up EndpointError is left as it is."""
    from fastvideo.errors import ServiceError
    from fastvideo.rewards.http import EndpointError, RemoteRewardError
    from fastvideo.train_grpo_flux import _with_resume_point, report_user_error

    from fastvideo.training.run import control

    monkeypatch.delenv(control.CONTROL_ENV, raising=False)  # a plain torchrun, not fastvideo.launch
    (tmp_path / "checkpoint-1").mkdir()
    exc = _with_resume_point(RemoteRewardError("reward server http://h:1 (detail) refused the request: HTTP 401"),
                             str(tmp_path))
    assert isinstance(exc, ServiceError) and "refused the request: HTTP 401" in str(exc)
    assert "no checkpoint is complete yet" in str(exc)  # an empty folder is not a complete checkpoint
    capsys.readouterr()
    assert report_user_error(exc, rank) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "train_grpo_flux: error: reward server http://h:1" in lines[0], lines
    assert lines[0].startswith("[rank 1] ") == (rank == 1)
    start_up = EndpointError("reward server http://h:1 does not answer")
    assert _with_resume_point(start_up, str(tmp_path)) is start_up
