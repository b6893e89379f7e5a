"""Launchers on a fake Ascend machine: device detection without torch, CANN sourced first, the
`device: ...; cann: ...` line, and the fix printed when torch-npu breaks `import torch`.

The fake machine, built per test in a tmp dir (nothing is installed): an ``npu-smi`` on PATH, a
``set_env.sh`` that exports FAKE_CANN_LOADED=1, and a stand-in ``torch_npu`` distribution that, like
torch_npu 2.7.1, registers a ``torch.backends`` entry point (Ascend/pytorch v7.2.0-pytorch2.7.1
setup.py) and fails to load without CANN with the real package's message (torch_npu/__init__.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastvideo.library_lines import line_summary

ROOT = Path(__file__).resolve().parents[2]
A3 = "scripts/finetune/finetune_flux_grpo_a3_16die.sh"
LAUNCHERS = [A3, "scripts/finetune/finetune_flux_grpo_8gpus.sh", "scripts/finetune/finetune_flux_grpo.sh",
             "scripts/preprocess/preprocess_flux_rl_embeddings.sh", "scripts/demo/grpo_tiny_cpu.sh",
             "scripts/finetune/finetune_flux_nft_8gpus.sh", "scripts/finetune/finetune_flux_nft_a3_16die.sh",
             "scripts/finetune/finetune_sd3_grpo_8gpus.sh", "scripts/finetune/finetune_sd3_grpo_a3_16die.sh",
             "scripts/finetune/finetune_sd3_nft_8gpus.sh", "scripts/finetune/finetune_sd3_nft_a3_16die.sh",
             "scripts/preprocess/preprocess_sd3_rl_embeddings.sh",
             "scripts/finetune/finetune_wan21_grpo_8gpus.sh", "scripts/finetune/finetune_wan21_grpo_a3_16die.sh",
             "scripts/finetune/finetune_wan22_grpo_8gpus.sh", "scripts/finetune/finetune_wan22_grpo_a3_16die.sh",
             "scripts/finetune/finetune_wan_i2v_14b_grpo_8gpus.sh", "scripts/finetune/finetune_wan_i2v_14b_grpo_a3_16die.sh",
             "scripts/finetune/finetune_wan_i2v_a14b_grpo_8gpus.sh",
             "scripts/finetune/finetune_wan_i2v_a14b_grpo_a3_16die.sh",
             "scripts/finetune/finetune_flux_awm_8gpus.sh", "scripts/finetune/finetune_flux_awm_a3_16die.sh",
             "scripts/finetune/finetune_flux_dgpo_8gpus.sh", "scripts/finetune/finetune_flux_dgpo_a3_16die.sh",
             "scripts/finetune/finetune_flux_flash_grpo_8gpus.sh", "scripts/finetune/finetune_flux_flash_grpo_a3_16die.sh",
             "scripts/finetune/finetune_flux_grpo_guard_8gpus.sh", "scripts/finetune/finetune_flux_grpo_guard_a3_16die.sh"]

STAND_IN = '''
import os

# torch_npu 2.7.1 appends this to the loader's error when libhccl.so cannot be found.
_NO_CANN = ("libhccl.so: cannot open shared object file: No such file or directory. Please check that the "
            "cann package is installed. Please run 'source set_env.sh' in the CANN installation path.")
if os.environ.get("FAKE_CANN_LOADED") != "1":
    raise ImportError(_NO_CANN)


def _autoload():
    import types

    import torch

    torch.npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 16)
'''


@pytest.fixture
def ascend(tmp_path):
    """(env, set_env.sh path) for a fake Ascend machine whose CANN is not yet sourced."""
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    (site / "torch_npu").mkdir(parents=True)
    (site / "torch_npu" / "__init__.py").write_text(STAND_IN)
    info = site / "torch_npu-2.7.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.7.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    bin_dir.mkdir()
    (bin_dir / "npu-smi").write_text("#!/bin/sh\necho 'npu-smi 25.0.rc1 (fake)'\n")
    (bin_dir / "npu-smi").chmod(0o755)
    set_env = tmp_path / "cann" / "set_env.sh"
    set_env.parent.mkdir()
    set_env.write_text("export FAKE_CANN_LOADED=1\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "PYTHON": sys.executable,
           "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "ASCEND_ROOT": str(tmp_path / "no_ascend_folder"),
           "CANN_SET_ENV": str(set_env), "DRY_RUN": "1"}
    return env, set_env


def launch(script: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)


def test_stand_in_breaks_import_torch_like_the_real_one(ascend):
    env, _ = ascend
    broken = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert broken.returncode != 0
    assert "Failed to load the backend extension: torch_npu" in broken.stderr
    ok = subprocess.run([sys.executable, "-c", "import torch; print(torch.npu.device_count())"],
                        env={**env, "FAKE_CANN_LOADED": "1"}, capture_output=True, text=True)
    assert ok.stdout.strip() == "16", ok.stderr


@pytest.mark.parametrize("script", LAUNCHERS)
def test_every_launcher_prints_the_device_line_first(ascend, script):
    env, set_env = ascend
    out = launch(script, env)
    assert out.returncode == 0, out.stderr
    first, command = out.stdout.splitlines()[:2]
    line = f"line: {line_summary()}"  # the library line of the environment that runs the tests
    if script.endswith("grpo_tiny_cpu.sh"):  # the demo forces the CPU (torch-npu not auto-loaded)
        assert first == f"device: cpu; cann: none; {line}"
    else:
        assert first == f"device: npu; cann: {set_env}; {line}"
    if script == A3:
        assert "--nproc_per_node=16" in command and "train_grpo_flux.py" in command
    if "preprocess" in script:  # NPROC from the (fake) NPU count
        assert "--nproc_per_node=16" in out.stdout


def test_without_cann_the_launcher_stops_with_the_fix(ascend, tmp_path):
    env, _ = ascend
    out = launch(A3, {**env, "CANN_SET_ENV": str(tmp_path / "missing" / "set_env.sh")})
    assert out.returncode == 1 and out.stdout == ""
    assert "torch-npu is installed but CANN's environment is not loaded (cann: none)" in out.stderr
    assert "source CANN's set_env.sh" in out.stderr and "pip uninstall torch-npu" in out.stderr


def test_ascend_hardware_without_torch_npu_is_refused(ascend):
    env, _ = ascend
    env = {**env, "PYTHONPATH": str(ROOT)}  # npu-smi present, no torch_npu installed
    out = launch(A3, env)
    assert out.returncode == 1
    assert "Ascend hardware found" in out.stderr and "env_setup.sh --target npu" in out.stderr


def test_no_ascend_no_gpu_gives_cpu(ascend):
    env, _ = ascend
    env = {**env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    env.pop("CANN_SET_ENV")
    if Path("/usr/local/Ascend").exists() or any(Path(p, "nvidia-smi").exists() for p in ("/usr/bin", "/bin")):
        pytest.skip("this machine has Ascend or NVIDIA software")
    out = launch(A3, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"device: cpu; cann: none; line: {line_summary()}"
