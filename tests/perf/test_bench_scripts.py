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


def test_decode_bench_table(capsys):
    mod = _load("decode")
    mod.main(["--preset", "tiny", "--sizes", "32", "--batch", "1", "--repeats", "1"])
    rows = [ln.split(" | ") for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 32x32 |")]
    assert [r[1] for r in rows] == ["fp32", "fp32+autocast", "bf16"]
    fp32 = rows[0]
    assert fp32[3] == "1.00x" and float(fp32[5]) == 0.0 and fp32[6] == "inf"
    assert all(float(r[5]) < 0.1 for r in rows)  # bf16 decoding stays close to fp32 in [0, 1]


def test_rewards_bench_table(capsys):
    mod = _load("rewards")
    mod.main(["--hps_size", "tiny", "--num_images", "4", "--size", "32", "--batch_sizes", "2", "4", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    rows = [ln.split(" | ") for ln in lines if ln.startswith(("| compressibility", "| hpsv2"))]
    assert [(r[0][2:], r[1]) for r in rows] == [(n, b) for n in ("compressibility", "hpsv2") for b in ("1", "2", "4")]
    assert all(float(r[5].rstrip(" |")) < 1e-4 for r in rows)  # batching does not change the scores


def test_rewards_bench_new_rewards_and_remote(capsys):
    mod = _load("rewards")
    mod.main(["--rewards", "aesthetic", "imagereward", "--num_images", "2", "--size", "32", "--batch_sizes", "2",
              "--repeats", "1"])
    rows = [ln.split(" | ") for ln in capsys.readouterr().out.splitlines() if ln.startswith(("| aesthetic", "| image"))]
    assert [(r[0][2:], r[1]) for r in rows] == [(n, b) for n in ("aesthetic", "imagereward") for b in ("1", "2")]
    mod.main(["--remote", "--rewards", "compressibility", "--num_images", "4", "--size", "32",
              "--remote_batch_sizes", "2", "4", "--encodings", "f32", "u8", "--repeats", "1"])
    rows = [ln.split(" | ") for ln in capsys.readouterr().out.splitlines() if ln.startswith("| compressibility")]
    assert [(r[1], r[2]) for r in rows] == [("2", "f32"), ("2", "u8"), ("4", "f32"), ("4", "u8")]
    # r[5] (local / remote time) rounds to 0.00 on a loaded machine: the rates, not their ratio, must be > 0
    assert all(r[6] == "identical |" and float(r[3]) > 0 and float(r[4]) > 0 and float(r[5]) >= 0 for r in rows)
    mod.main(["--transfer", "--num_images", "4", "--size", "16", "--remote_batch_sizes", "2", "--repeats", "1"])
    rows = [ln.split(" | ") for ln in capsys.readouterr().out.splitlines() if ln.startswith(("| f32", "| u8", "| png"))]
    assert [r[0][2:] for r in rows] == ["f32", "u8", "png"] and all(float(r[2].rstrip(" |")) > 0 for r in rows)


def test_rollout_bench_times_both_attention_backends(capsys):
    mod = _load("rollout")
    mod.main(["--preset", "tiny", "--height", "32", "--width", "32", "--steps", "1", "--generations", "2",
              "--batch-sizes", "1", "2", "--seq-len", "8", "--repeats", "1", "--sdpa", "default", "math"])
    rows = [ln.split("|") for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith(("default", "math"))]
    assert [(r[0].strip(), int(r[1])) for r in rows] == [("default", 1), ("default", 2), ("math", 1), ("math", 2)]
    assert rows[0][4].strip() == "1.00x"


def test_iteration_bench_overlap_ab(monkeypatch, capsys):
    mod = _load("iteration")
    monkeypatch.setattr("sys.argv", ["iteration.py", "--preset", "tiny", "--size", "32", "--steps", "2",
                                     "--generations", "4", "--rollout_batch_size", "2", "--iterations", "1",
                                     "--micro", "2", "--overlap_ab", "--reward", "hps_tiny"])
    mod.main()
    rows = [ln.split(" | ") for ln in capsys.readouterr().out.splitlines() if ln.startswith(("| serial", "| overlapped"))]
    assert [r[0] for r in rows] == ["| serial", "| overlapped"]
    assert rows[0][-1] == "1.00x |"
    assert all(float(r[4]) > 0 for r in rows)  # the reward's busy time is measured in both modes


def test_embedding_cache_bench_compares_the_policies():
    """bench/embedding_cache_hits.py on small scenarios: everything fitting hits every read after the
    first epoch under both policies; a repeated order larger than the room defeats LRU entirely
    (each record is evicted before its turn comes again) while the kept records hit room / share."""
    mod = _load("embedding_cache_hits")
    fits = mod.hit_rates(8, 1, 2, 8, False, epochs=3, measure_from=1)
    assert fits["keep_admitted"] == fits["lru"] == 1.0 and fits["reads"] == 16
    cyclic = mod.hit_rates(40, 2, 1, 5, True, epochs=4, measure_from=1)  # a share of 20, room 5
    assert cyclic["lru"] == 0.0 and cyclic["keep_admitted"] == 5 / 20
