"""Host threads per training process, for a launcher's OMP_NUM_THREADS:

    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(python -m fastvideo.tools.omp_threads "$NPROC_PER_NODE")}

torchrun sets OMP_NUM_THREADS=1 when it is unset and more than one process runs per node, so the
host work of a rank (CPU noise, image saving, reward resizing, CPU-offloaded AdamW, weight
conversion at load) then runs on one thread. This gives each process its share of the cores this
process may run on (its CPU affinity, else all cores): cores // processes, at least 1. An
OMP_NUM_THREADS already set is kept (the launcher's ${OMP_NUM_THREADS:-...} override). Imports
nothing heavy: it runs before every launch.
"""

from __future__ import annotations

import os
import sys


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_per_process(processes: int, cores: int | None = None) -> int:
    """cores // processes, at least 1 (processes < 1 counts as 1)."""
    cores = usable_cores() if cores is None else cores
    return max(1, cores // max(1, processes))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m fastvideo.tools.omp_threads PROCESSES_PER_NODE", file=sys.stderr)
        return 2
    print(os.environ.get("OMP_NUM_THREADS") or threads_per_process(int(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
