"""bench/flops.py and bench/gpu_flux_full.py run (CPU smoke tests with the tiny config)."""

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_bench_refuses_cpu_without_allow_cpu():
    mod = _load("gpu_flux_full")
    with pytest.raises(SystemExit, match="needs an accelerator"):
        mod.main([])


def test_gpu_bench_cpu_smoke(capsys):
    mod = _load("gpu_flux_full")
    mod.main(["--allow_cpu", "--batch-sizes", "1", "--rollout-steps", "1", "--update-steps", "1", "--warmup", "1",
              "--optimizer", "sgd", "--peak_tflops", "1", "--height", "32", "--width", "32", "--text-tokens", "8"])
    out = capsys.readouterr().out
    assert "config tiny, 32x32, 8 text tokens" in out
    assert "update MFU (fwd+bwd)" in out and "compute-only estimate" in out


def test_flops_bench_table(capsys):
    mod = _load("flops")
    mod.main(["--presets", "tiny", "--sizes", "32", "--text-tokens", "8", "--batch", "1", "--no-flux-dev"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("tiny")]
    assert len(lines) == 4  # forward, fwd+bwd, fwd+bwd ckpt, VAE decode
    assert all(ln.split()[-1] == "1.00000" for ln in lines)
