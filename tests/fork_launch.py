"""torchrun for the test suite without a fresh interpreter per rank.

``python -m torch.distributed.run`` starts every worker as a new interpreter, and each one spends
about 7 s of CPU importing torch, diffusers and transformers before it trains a tiny model for a
few seconds: most of the 2-rank end-to-end tests' time went there. ``fork_torchrun`` runs the
same entry point (``fastvideo.train_grpo_flux.main``) in ranks forked from the test process,
where those imports are already done, with the environment torchrun gives its workers, and
returns what ``subprocess.run`` returns (returncode, stdout, stderr), so a test cannot tell them
apart except by time.

What it does not cover is torchrun itself (its rendezvous, signal forwarding, ``TORCHELASTIC_*``
variables): the tests of the launch path (tests/test_preflight.py, tests/training/test_signals.py,
tests/scripts/) start the real launcher, and FLUX_GRPO_TEST_REAL_TORCHRUN=1 sends every test
through the real torchrun.

Forking is safe here for the reason tests/dist_utils.py gives: the test process never initialises a
process group, and each rank makes torch single-threaded before its first op (OMP_NUM_THREADS=1,
as torchrun sets it).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

_TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(_TESTS)
_PRELOADED = False


def preload() -> None:
    """Import in the test process what every rank imports, once."""
    global _PRELOADED
    if _PRELOADED:
        return
    import diffusers.models.autoencoders.autoencoder_kl  # noqa: F401
    import diffusers.models.transformers.transformer_flux  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401

    import fastvideo.train_grpo_flux  # noqa: F401
    import fastvideo.training.trainer  # noqa: F401
    try:
        import peft  # noqa: F401
    except ImportError:
        pass
    _PRELOADED = True


def _entry(script: str):
    """The ``main`` of a fastvideo/<script> entry point."""
    module = "fastvideo." + os.path.splitext(script)[0].replace("/", ".")
    return importlib.import_module(module).main


def _rank(script: str, argv: list[str], env: dict, out_path: str, err_path: str, cwd: str) -> None:
    """The body of one forked rank; never returns."""
    code = 1
    try:
        out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        # pytest's log-capturing handlers belong to the test process: a fresh worker has none.
        logging.root.handlers.clear()
        for logger in logging.Logger.manager.loggerDict.values():
            if isinstance(logger, logging.Logger):
                logger.handlers = [h for h in logger.handlers if not type(h).__module__.startswith("_pytest")]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        # A fresh worker would find the launcher's PYTHONPATH entries first on sys.path.
        for entry in reversed([e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        import torch

        torch.set_num_threads(1)
        if _TESTS not in sys.path:
            sys.path.insert(0, _TESTS)
        import hccl_rules

        hccl_rules.apply(env.get("FLUX_GRPO_HCCL_RULES", "0") == "1")  # off: also undone if inherited
        sys.argv = [os.path.join(ROOT, "fastvideo", script), *argv]
        try:
            code = _entry(script)(list(argv)) or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - an uncaught error ends the rank as it would a worker
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _stop(pids: dict[int, int], sig: int) -> None:
    for pid in pids.values():
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def fork_torchrun(argv: list[str], env: dict, nproc: int = 2, timeout: float = 300,
                  script: str = "train_grpo_flux.py", cwd: str = ROOT) -> subprocess.CompletedProcess:
    """Run ``fastvideo/<script> argv`` on ``nproc`` forked ranks; ``env`` is the whole environment
    the launcher would see. Like torchrun: when a rank fails, the others are stopped (SIGTERM,
    then SIGKILL after 10 s) and the return code is 1; stdout/stderr hold the ranks' output in
    rank order."""
    from dist_utils import free_port

    preload()
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="fork_torchrun_")
    paths = [(os.path.join(tmp, f"{r}.out"), os.path.join(tmp, f"{r}.err")) for r in range(nproc)]
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, int] = {}
    for rank in range(nproc):
        rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                        LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        pid = os.fork()
        if pid == 0:
            _rank(script, argv, rank_env, *paths[rank], cwd)
        pids[rank] = pid
    codes: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    killed_at = None
    timed_out = False
    while len(codes) < nproc:
        for rank, pid in pids.items():
            if rank in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[rank] = os.waitstatus_to_exitcode(status)
        failed = any(c != 0 for c in codes.values())
        now = time.monotonic()
        if (failed or now > deadline) and killed_at is None and len(codes) < nproc:
            timed_out = now > deadline
            _stop({r: p for r, p in pids.items() if r not in codes}, signal.SIGTERM)
            killed_at = now
        elif killed_at is not None and now - killed_at > 10:
            _stop({r: p for r, p in pids.items() if r not in codes}, signal.SIGKILL)
        time.sleep(0.02)
    stdout = "".join(open(p[0], errors="replace").read() for p in paths)
    stderr = "".join(open(p[1], errors="replace").read() for p in paths)
    for p in paths:
        for f in p:
            os.unlink(f)
    os.rmdir(tmp)
    cmd = ["fork_torchrun", f"--nproc_per_node={nproc}", script, *argv]
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(cmd, 0 if all(c == 0 for c in codes.values()) else 1, stdout, stderr)
