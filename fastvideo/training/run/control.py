"""How a worker process is stopped: preemption signals, its launcher's death, and the files it
leaves for the launcher (fastvideo.launch) to report from.

- SIGTERM (a scheduler's preemption) and SIGINT (Ctrl-C) only set a flag; the trainer reads it at
  the end of each iteration, all ranks agree on it (an int32 MAX over the data-parallel group, as
  HCCL allows), the run writes a checkpoint (unless --no_checkpoint_on_signal), prints the command
  that resumes it and exits 0 (SIGTERM) or 130 (SIGINT). A checkpoint holds whole iterations, so
  the iteration under way finishes first: that is what makes the resumed run equal the
  uninterrupted one.
- Under fastvideo.launch, torchrun also sends SIGTERM to the workers when a peer failed: the
  launcher marks a real stop request in FASTVIDEO_CONTROL_DIR/stop, and a teardown (the agent
  about to signal its workers without a stop request) with a mark per worker pid; a worker so
  marked exits at once (there is no peer to agree with). A signal with neither mark reached this
  rank alone (a scheduler stopping one worker): the rank stops as if all had got it -- the others
  learn it when they agree at the end of the iteration, the checkpoint is written -- and leaves a
  mark from which the launcher reports it in one line.
- Workers ask the kernel to kill them when their launcher dies (prctl PR_SET_PDEATHSIG on Linux):
  after a ``kill -9`` of torchrun no orphan keeps training into the folder a relaunch resumes. The
  guard is armed first thing and checked against the launcher's pid (FASTVIDEO_LAUNCHER_PID, set by
  fastvideo.launch, else the parent pid read when the worker's Python started): a launcher that
  died while the worker was still starting is noticed, and the worker exits instead of living on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

CONTROL_ENV = "FASTVIDEO_CONTROL_DIR"
LAUNCHER_PID_ENV = "FASTVIDEO_LAUNCHER_PID"  # the process that spawns the workers (torchrun's agent)
LAUNCH_ENV = "FASTVIDEO_LAUNCH_ARGV"  # the launcher's own arguments (before the training script)
STOP_MARK = "stop"
EXIT_CODES = {signal.SIGTERM: 0, signal.SIGINT: 130}
_PR_SET_PDEATHSIG = 1


def launcher_pid(parent_at_start: int) -> int:
    """The pid this worker's parent must have: fastvideo.launch's (FASTVIDEO_LAUNCHER_PID, exact),
    else ``parent_at_start``, the parent pid read as the worker's Python started (plain torchrun)."""
    value = os.environ.get(LAUNCHER_PID_ENV, "")
    return int(value) if value.isdigit() else parent_at_start


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux only; returns
    whether it is armed). Called by torchrun workers only: their parent is the launcher.

    ``parent``: the launcher's pid (launcher_pid). The request covers only a parent alive when it
    is made: if the parent is no longer ``parent`` (it died while this worker started, and this one
    was re-parented), the launcher is gone and this worker ends at once with ``sig``."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the launcher died before the request took effect
        sys.stderr.write(f"worker {os.getpid()}: its launcher (pid {parent}) is gone; exiting\n")
        sys.stderr.flush()
        os.kill(os.getpid(), sig)
    return True


RENDEZVOUS_ENV = "FASTVIDEO_RENDEZVOUS_TIMEOUT_S"
RENDEZVOUS_DEFAULT_S, RENDEZVOUS_NOTICE_S = 600.0, 30.0


@contextlib.contextmanager
def rendezvous_watchdog(prog: str, rank: int, world_size: int):
    """Around the process group's start outside torchrun (WORLD_SIZE set by hand; torchrun's agent
    starts workers only once all have joined): ranks that never start would keep this one waiting
    for the process group's 30-minute timeout, silently. After RENDEZVOUS_NOTICE_S it says what it
    waits for; after $FASTVIDEO_RENDEZVOUS_TIMEOUT_S (default 600) it stops: one line, exit 2."""
    if world_size <= 1 or os.environ.get("TORCHELASTIC_RUN_ID"):
        yield
        return
    try:
        limit = float(os.environ.get(RENDEZVOUS_ENV, RENDEZVOUS_DEFAULT_S))
    except ValueError:
        limit = RENDEZVOUS_DEFAULT_S
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    joined = threading.Event()

    def watch() -> None:
        if limit > RENDEZVOUS_NOTICE_S and not joined.wait(RENDEZVOUS_NOTICE_S):
            sys.stderr.write(f"{prog}: rank {rank} waits for the other {world_size - 1} rank(s) of WORLD_SIZE="
                             f"{world_size} at {where} (up to {limit:g} s, {RENDEZVOUS_ENV})\n")
            sys.stderr.flush()
        if not joined.wait(max(limit - RENDEZVOUS_NOTICE_S, 0) if limit > RENDEZVOUS_NOTICE_S else limit):
            sys.stderr.write(f"{prog}: error: rank {rank} of WORLD_SIZE={world_size}: the other ranks did not join at "
                             f"{where} within {limit:g} s; start every rank (torchrun --nproc_per_node={world_size} "
                             f"..., or python -m fastvideo.launch), or unset WORLD_SIZE and RANK for one process\n")
            sys.stderr.flush()
            os._exit(2)

    threading.Thread(target=watch, name="rendezvous-watchdog", daemon=True).start()
    try:
        yield
    finally:
        joined.set()


def control_dir() -> Path | None:
    value = os.environ.get(CONTROL_ENV)
    return Path(value) if value else None


def mark_stop_requested(folder: Path, signum: int) -> None:
    """The launcher's side: a stop was asked for (not a peer's failure)."""
    (folder / STOP_MARK).write_text(str(int(signum)))


def write_rank_error(rank: int, line: str) -> None:
    """The one line of a failed rank, for the launcher to print once across ranks."""
    folder = control_dir()
    if folder is not None and folder.is_dir():
        (folder / f"error-rank{rank}.txt").write_text(line.rstrip("\n") + "\n")


TEARDOWN_MARK = "teardown-{pid}"  # the launcher's agent stops this worker (a peer failed)
LONE_SIGNAL_MARK = "signal-rank{rank}"  # a signal that reached this rank alone (not the launcher)


def mark_teardown(folder: Path, pids) -> None:
    """The launcher's side, before torchrun's agent signals its workers ``pids`` to stop them (a
    peer failed, or the run ended): unless a stop was asked for, each of them is being torn down."""
    if not (folder / STOP_MARK).exists():
        for pid in pids:
            (folder / TEARDOWN_MARK.format(pid=pid)).touch()


def lone_signals(folder: Path) -> dict[int, int]:
    """{rank: signal} of the signals that reached one rank alone (LONE_SIGNAL_MARK)."""
    out = {}
    for path in folder.glob(LONE_SIGNAL_MARK.format(rank="*")):
        with contextlib.suppress(ValueError):
            out[int(path.name.rpartition("rank")[2])] = int(path.read_text())
    return out


def _signal_kind(wait_s: float = 2.0) -> str:
    """Under the launcher, what a signal to this worker is: 'stop' (the launcher got it: the stop
    mark), 'teardown' (torchrun's agent stopping the survivors of a failed peer: its mark for this
    pid) or 'lone' (neither within ``wait_s``: a scheduler signalled this rank alone, and the other
    ranks learn it when they agree at the end of the iteration). Outside the launcher: 'stop'."""
    folder = control_dir()
    if folder is None:
        return "stop"
    deadline = time.monotonic() + wait_s
    while True:
        if (folder / STOP_MARK).exists():
            return "stop"
        if (folder / TEARDOWN_MARK.format(pid=os.getpid())).exists():
            return "teardown"
        if time.monotonic() > deadline:
            return "lone"
        time.sleep(0.05)


class StopRequest:
    """SIGTERM / SIGINT -> a flag the loop polls at iteration boundaries (install() arms it)."""

    def __init__(self):
        self.signum = 0
        self._previous = {}

    def install(self) -> "StopRequest":
        try:
            for sig in EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread (an embedding application): signals stay as they were
            pass
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum:  # a repeat (the terminal's Ctrl-C and torchrun's forwarded one): already stopping
            return
        kind = _signal_kind()
        if kind == "teardown":
            os._exit(128 + signum)
        self.signum = signum
        rank = os.environ.get("RANK", "0") or "0"
        if kind == "lone":  # the launcher reports it once the ranks have stopped
            (control_dir() / LONE_SIGNAL_MARK.format(rank=rank)).write_text(str(int(signum)))
        elif rank == "0":  # every rank gets the signal; one says so
            name = signal.Signals(signum).name
            sys.stderr.write(f"[stop] {name} received: finishing the current iteration, then stopping\n")
            sys.stderr.flush()

    def agreed(self, dims, device) -> int:
        """The signal any rank received (0: none); every rank calls this at the same point. int32,
        not bool: HCCL reduces no bool."""
        import torch

        flag = torch.tensor([self.signum], dtype=torch.int32, device=device)
        if dims is not None and dims.world_size > 1:
            dims.all_reduce_max(flag)
        return int(flag.item())

    @staticmethod
    def exit_code(signum: int) -> int:
        return EXIT_CODES.get(signal.Signals(signum), 128 + signum)


def plain_torchrun_note(signum: int) -> str | None:
    """Under a plain ``torchrun`` (not fastvideo.launch), the line to print after the checkpoint:
    torchrun's agent (the workers' parent, torch's own code) turns the signal into a SignalException
    that it re-raises once the workers exit, so the last thing on the terminal is its traceback and
    the exit status is 1. None under fastvideo.launch (it exits 0 / 130) or outside torchrun."""
    if not os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get(LAUNCHER_PID_ENV):
        return None
    name = signal.Signals(signum).name
    return (f"[stop] {name}: the checkpoint above is complete; torchrun's agent now ends with its own "
            f"SignalException traceback and exit status 1 (python -m fastvideo.launch, which every launcher "
            f"uses, exits {EXIT_CODES.get(signal.Signals(signum), 128 + signum)} instead)")


def resume_command(argv: list[str], checkpoint: str | Path, python: str | None = None) -> str:
    """The command line that continues this run from ``checkpoint``: the launcher's arguments
    (when started by fastvideo.launch), this script, its flags without an earlier
    --resume_from_checkpoint / --overwrite, and --resume_from_checkpoint CHECKPOINT."""
    import shlex

    script, flags = argv[0], _without_flags(list(argv[1:]), {"--resume_from_checkpoint": 1, "--overwrite": 0})
    flags = _last_of_each(flags)
    launch = os.environ.get(LAUNCH_ENV)
    if launch is not None:
        head = [python or sys.executable, "-m", "fastvideo.launch", *shlex.split(launch)]
    else:
        nproc = os.environ.get("LOCAL_WORLD_SIZE", "1")
        head = ["torchrun", f"--nproc_per_node={nproc}"]
    return shlex.join([*head, script, *flags, "--resume_from_checkpoint", str(checkpoint)])


def _without_flags(argv: list[str], drop: dict[str, int]) -> list[str]:
    """argv without the flags of ``drop`` ({flag: number of values}), in either --f v or --f=v form."""
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        name = word.split("=", 1)[0]
        if name in drop:
            i += 1 + (drop[name] if "=" not in word else 0)
            continue
        out.append(word)
        i += 1
    return out


def _last_of_each(argv: list[str]) -> list[str]:
    """argv with each flag once, with its last value: the one argparse used (a launcher's own
    flags come first and a user's repeat of one wins; the resume command needs only the winner)."""
    groups: list[tuple[str | None, list[str]]] = []
    for word in argv:
        if word.startswith("--"):
            groups.append((word.split("=", 1)[0], [word]))
        elif groups:
            groups[-1][1].append(word)
        else:
            groups.append((None, [word]))
    last = {name: i for i, (name, _) in enumerate(groups) if name}
    return [w for i, (name, words) in enumerate(groups) if name is None or last[name] == i for w in words]
