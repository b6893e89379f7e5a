"""OMP_NUM_THREADS for launchers: cores per process, overridable."""

import subprocess
import sys

from fastvideo.tools import omp_threads


def test_cores_split_between_processes():
    assert omp_threads.threads_per_process(8, cores=192) == 24
    assert omp_threads.threads_per_process(16, cores=8) == 1  # never 0
    assert omp_threads.threads_per_process(0, cores=6) == 6
    assert omp_threads.threads_per_process(3, cores=8) == 2
    assert omp_threads.threads_per_process(1) == omp_threads.usable_cores()


def test_cli_keeps_an_explicit_setting(monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert omp_threads.main(["1"]) == 0
    assert capsys.readouterr().out.strip() == str(omp_threads.usable_cores())
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert omp_threads.main(["2"]) == 0 and capsys.readouterr().out.strip() == "5"
    assert omp_threads.main(["two"]) == 2


def test_runs_without_torch():
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    code = ("import sys; sys.argv = ['x', '2']; from fastvideo.tools import omp_threads; omp_threads.main(); "
            "assert 'torch' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": ""})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 1


def test_launch_sets_cores_per_process_unless_set(monkeypatch):
    from fastvideo import launch

    monkeypatch.setattr(omp_threads, "usable_cores", lambda: 16)
    args, _ = launch.split_command(["--nproc_per_node=2", "fastvideo/train_grpo_flux.py", "--h", "64"])
    env = {}
    assert launch.set_host_threads(args, env) == "8" == env["OMP_NUM_THREADS"]
    env = {"OMP_NUM_THREADS": "7"}
    assert launch.set_host_threads(args, env) == "7"  # the override
    auto, _ = launch.split_command(["--nproc_per_node=auto", "fastvideo/train_grpo_flux.py"])
    assert launch.set_host_threads(auto, {}) is None  # torchrun decides the count: left to it
