"""torchrun with the checks and reports a cluster job needs: what scripts/common.sh runs.

    python -m fastvideo.launch [torchrun flags] fastvideo/train_grpo_flux.py [training flags]

1. Before any worker starts, the configuration check (fastvideo.preflight) runs once, here: every
   problem one line, exit 2 (FASTVIDEO_PREFLIGHT=0 skips it).
2. torchrun runs the workers. A user error inside the ranks is written by each rank to a control
   folder and printed here once per distinct line (not once per rank), exit 2, without torchrun's
   ChildFailedError traceback; another failure is summarised in one line per distinct message
   (each rank printed its own traceback), exit 1.
3. OMP_NUM_THREADS, unless set, is the node's cores per process (set_host_threads).
4. SIGTERM / SIGINT: the workers finish their iteration, write a checkpoint and print the resume
   command (training/run/control.py); this process exits 0 (SIGTERM) or 130 (SIGINT). torchrun waits
   TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (default here 900) for them before it kills them. A
   signal to one worker alone (a scheduler stopping one rank) does the same on every rank, and this
   process says so in one line with the same exit status.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

DEFAULT_SHUTDOWN_TIMEOUT_S = "900"
PROG = "train_grpo_flux"


def split_command(argv: list[str]):
    """(torchrun's parsed arguments, the torchrun flags before the script)."""
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(argv)
    head = argv[:len(argv) - len(args.training_script_args) - 1]
    return args, head


def _nodes(nnodes: str) -> int:
    return int(str(nnodes).split(":")[-1])


def _nproc(value: str) -> int:
    try:
        return int(value)
    except ValueError:  # "auto", "gpu", ...: torchrun decides; the world check is skipped
        return 0


def set_host_threads(args, environ=os.environ) -> str | None:
    """OMP_NUM_THREADS for the workers, when it is not set: this node's cores (its affinity) split
    between --nproc_per_node processes (torchrun would otherwise set 1, and each rank's host work,
    CPU noise, image saving, the reward's resize, offloaded AdamW, would run on one thread).
    An OMP_NUM_THREADS already set is kept (the override). Returns the value the workers see."""
    from fastvideo.tools.omp_threads import threads_per_process

    nproc = _nproc(args.nproc_per_node)
    if "OMP_NUM_THREADS" not in environ and nproc > 0:
        environ["OMP_NUM_THREADS"] = str(threads_per_process(nproc))
    return environ.get("OMP_NUM_THREADS")


def program(script: str) -> str:
    """The name the launch's lines give: the preprocessing entry point's, else the trainer's."""
    from fastvideo.preflight import PREPROCESS_SCRIPTS

    return PREPROCESS_SCRIPTS.get(os.path.basename(script), PROG)


def preflight(args) -> int:
    """0, or 2 after printing every problem of the training (or preprocessing) command."""
    from fastvideo import preflight as check

    if os.environ.get("FASTVIDEO_PREFLIGHT", "1") == "0":
        return 0
    nproc = _nproc(args.nproc_per_node)
    if os.path.basename(args.training_script) in check.PREPROCESS_SCRIPTS:
        problems = check.check_preprocess(list(args.training_script_args))
    else:
        flags = check.script_flags(args.training_script, list(args.training_script_args))
        if flags is None:
            return 0
        problems = check.check_training(flags, nproc, _nodes(args.nnodes), check_world=nproc > 0)
    if problems:
        check.report(problems, program(args.training_script), max(nproc, 1) * _nodes(args.nnodes))
        return 2
    return 0


def _mark_signals(control: Path) -> None:
    """torchrun's agent turns SIGTERM / SIGINT into a shutdown that forwards the signal to the
    workers; mark it first, so a worker can tell a stop request from a peer's failure."""
    from torch.distributed.elastic.multiprocessing import api

    from fastvideo.training.run.control import mark_stop_requested, mark_teardown

    original, close = api._terminate_process_handler, api.PContext.close

    def handler(signum, frame):
        mark_stop_requested(control, signum)
        original(signum, frame)

    def closing(self, *args, **kwargs):  # the agent stops its workers: a peer failed (or the run ended)
        mark_teardown(control, self.pids().values())
        return close(self, *args, **kwargs)

    api._terminate_process_handler = handler
    api.PContext.close = closing


def report_lone_signals(control: Path, prog: str = PROG, stream=None) -> int:
    """After the workers exited 0: a signal that reached one rank alone (a scheduler stopping one
    worker) in one line, and its exit status (0 for SIGTERM, 130 for SIGINT); 0 when there was none."""
    from fastvideo.training.run.control import EXIT_CODES, lone_signals

    lone = lone_signals(control)
    if not lone:
        return 0
    signum = lone[min(lone)]
    name = signal.Signals(signum).name
    (stream or sys.stderr).write(
        f"{prog}: {name} reached {_ranks(list(lone))} alone (not this launcher): every rank stopped after the "
        "iteration under way; the checkpoint and the command that resumes it are above\n")
    (stream or sys.stderr).flush()
    return EXIT_CODES.get(signal.Signals(signum), 128 + signum)


def rank_errors(control: Path) -> dict[str, list[int]]:
    """{error line: ranks} from the control folder."""
    out: dict[str, list[int]] = {}
    for path in sorted(control.glob("error-rank*.txt")):
        rank = int(path.stem.removeprefix("error-rank"))
        for line in path.read_text().splitlines()[:1]:
            out.setdefault(line, []).append(rank)
    return out


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"


# A rank torchrun stopped because another failed: it exits 128 + SIGTERM at once (run_control), or
# dies of the signal itself before its handler is installed, or of SIGKILL after the grace period.
TEARDOWN_EXITS = {128 + signal.SIGTERM, -signal.SIGTERM, 128 + signal.SIGKILL, -signal.SIGKILL}


def report_children(failures: dict, control: Path, stream=None, prog: str = PROG) -> int:
    """After torchrun's ChildFailedError: each distinct error once; 2 if the failed ranks exited 2
    (a user error: a rank's share of the data, say) or were torn down for it, else 1."""
    stream = stream or sys.stderr
    codes = {rank: f.exitcode for rank, f in failures.items()}
    errors = rank_errors(control)
    user = 2 in codes.values() and all(code == 2 or code in TEARDOWN_EXITS for code in codes.values())
    for line, ranks in errors.items():
        stream.write(line if user and len(ranks) > 1 else f"{line} ({_ranks(ranks)})")
        stream.write("\n")
    if not user or not errors:
        shown = ", ".join(f"rank {r}: exit {c}" for r, c in sorted(codes.items()))
        stream.write(f"{prog}: worker(s) failed ({shown}); their output is above\n")
    stream.flush()
    return 2 if user else 1


def run(argv: list[str]) -> int:
    from fastvideo.import_name import EXIT_CODE, problem

    foreign = problem(check_origin=True)  # hao-ai-lab's FastVideo installed here too: before any worker
    if foreign is not None:
        sys.stderr.write(f"{PROG}: error: {foreign}\n")
        return EXIT_CODE
    args, head = split_command(argv)
    code = preflight(args)
    if code:
        return code
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from fastvideo.training.run.control import CONTROL_ENV, LAUNCH_ENV, LAUNCHER_PID_ENV

    control = Path(tempfile.mkdtemp(prefix="fastvideo-launch-"))
    os.environ[CONTROL_ENV] = str(control)
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # torchrun's agent runs here: the workers' parent
    os.environ[LAUNCH_ENV] = shlex.join(head)
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT_S)
    set_host_threads(args)
    _mark_signals(control)
    if os.environ.get("FASTVIDEO_DEBUG", "") in ("", "0"):
        # The agent logs each failed rank with its own banner; report_children says it once.
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    sys.stderr.write(f"+ torchrun {shlex.join(argv)}\n")
    sys.stderr.flush()
    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        return report_children(exc.failures, control, prog=program(args.training_script))
    except SignalException as exc:
        return 130 if exc.sigval == signal.SIGINT else 0
    except Exception as exc:  # noqa: BLE001 - the rendezvous' own failures: one line when the user can fix it
        line = rendezvous_error(exc, args)
        if line is None:
            raise
        sys.stderr.write(f"{program(args.training_script)}: error: {line}\n")
        sys.stderr.flush()
        return 2
    else:
        return report_lone_signals(control, prog=program(args.training_script))
    finally:
        shutil.rmtree(control, ignore_errors=True)


def rendezvous_error(exc: BaseException, args) -> str | None:
    """One line for a rendezvous failure the user can fix (the port is taken), else None."""
    text = str(exc)
    if "EADDRINUSE" not in text and "address already in use" not in text.lower():
        return None
    port = args.master_port if not args.rdzv_endpoint else args.rdzv_endpoint.rpartition(":")[2]
    return (f"port {port} on this node is in use (another run, or a process it left, listens there): give the "
            f"launch another --master_port (the launchers' MASTER_PORT=...), or find the process with "
            f"`ss -ltnp 'sport = :{port}'`; no worker was started")


def _stop_before_workers(signum, frame) -> None:
    """SIGTERM / SIGINT before torchrun took the signals over (the launcher still imports or runs the
    pre-flight): no worker exists, nothing to save; one line and the signal's exit code (0 / 130),
    not a silent death by the signal."""
    name = signal.Signals(signum).name
    sys.stderr.write(f"{PROG}: {name} before any worker started: nothing to stop or save\n")
    sys.stderr.flush()
    raise SystemExit(130 if signum == signal.SIGINT else 0)


def main(argv: list[str] | None = None) -> int:
    # SIGTERM last: once it is caught, both are (tests wait for that). torchrun's agent installs its
    # own handlers when it starts the workers.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop_before_workers)
    return run(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
