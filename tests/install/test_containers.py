"""The container recipes (docker/*.Dockerfile): their base images pair with the install plan, and their
build step is env_setup.sh run as the image runs it (the pip stand-in of conftest.py records the installs;
no Docker daemon is needed). The Ascend build has no NPU driver (the host's is mounted at run time):
env_setup.sh must install torch-npu there without importing it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import install_plan  # noqa: E402
from test_env_setup_npu import _fake_cann, _pip_lines  # noqa: E402

LINES = ("recipe", "current")


def _dockerfile(name: str) -> str:
    return (ROOT / "docker" / f"{name}.Dockerfile").read_text()


def _arg_default(text: str, arg: str) -> str:
    m = re.search(rf"^ARG {arg}=(\S+)$", text, re.MULTILINE)
    assert m, f"no ARG {arg}=... default"
    return m.group(1)


def _setup_args(text: str, line: str) -> list[str]:
    """The arguments of the image's `RUN bash env_setup.sh ...` with its ${LINE} build argument."""
    m = re.search(r"^RUN bash env_setup\.sh (.+)$", text, re.MULTILINE)
    assert m, "the image does not run env_setup.sh"
    return m.group(1).replace('"${LINE}"', line).split()


def _ascend_tag() -> tuple[str, str, str]:
    """(CANN version, chip, Python version) of the default base image's tag <cann>-<chip>-<os>-py<X.Y>."""
    image = _arg_default(_dockerfile("ascend"), "CANN_IMAGE")
    m = re.fullmatch(r"quay\.io/ascend/cann:(\d+\.\d+\.(?:\d+|rc\d+))-(a3|910b)-[a-z]+[\d.]+-py(3\.\d+)", image)
    assert m, image
    return m.group(1).upper(), m.group(2), m.group(3)  # 8.3.rc1 -> 8.3.RC1, as CANN names it


@pytest.mark.parametrize("line", LINES)
def test_ascend_base_image_pairs_with_torch_npu_on_both_lines(line):
    cann, chip, python = _ascend_tag()
    install_plan.check_npu_python(python, line)  # raises PlanError when the image's Python cannot run it
    torch, npu = install_plan.npu_pair_for(cann, line)
    assert torch and npu.startswith(torch.split("+")[0])


def test_cuda_base_image_python_is_supported():
    image = _arg_default(_dockerfile("cuda"), "PYTHON_IMAGE")
    m = re.fullmatch(r"python:(3)\.(\d+)-slim-\w+", image)
    assert m and (3, int(m.group(2))) >= (3, 10), image


def test_ascend_build_installs_torch_npu_without_a_driver(env, tmp_path):
    """The image's build step on a fake CANN tree of the base image's version and no driver: torch-npu of
    that CANN is installed, torch_npu is not imported (its stand-in always fails here), exit 0."""
    venv, e, log = env
    cann, _, _ = _ascend_tag()
    (tmp_path / "mods" / "torch_npu.py").write_text("raise ImportError('libascend_hal.so: cannot open shared object file')\n")
    home = _fake_cann(tmp_path, cann)
    args = _setup_args(_dockerfile("ascend"), "recipe")
    assert args[:2] == ["--target", "npu"]
    run = ["bash", str(ROOT / "env_setup.sh"), *args, "--venv", str(venv), "--cann-home", str(home)]
    e_nodriver = dict(e, ASCEND_DRIVER_HOME=str(tmp_path / "no-driver"))
    r = subprocess.run(run, env=e_nodriver, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"torch-npu=={install_plan.npu_pair_for(cann, 'recipe')[1]}" in _pip_lines(log)[0].split()
    assert "no NPU driver at" in r.stdout and "env_setup.sh: ok - torch" in r.stdout
    # Where the driver is, the import is checked: the failing stand-in fails the set-up.
    r = subprocess.run([*run, "--force"], env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "libascend_hal.so" in r.stderr


def test_cuda_build_installs_no_torch_npu(env):
    venv, e, log = env
    args = _setup_args(_dockerfile("cuda"), "current")
    assert args == ["--target", "cuda", "--line", "current"]
    r = subprocess.run(["bash", str(ROOT / "env_setup.sh"), *args, "--venv", str(venv)], env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = _pip_lines(log)
    assert not any("torch-npu" in line for line in lines)
    assert lines[-1].endswith(f"-e .[test,video] -c {ROOT / 'constraints' / 'current.txt'}")


def test_build_context_leaves_out_environments_and_weights():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".venv", ".venv-*", "data/", "hps_ckpt/", "outputs*/"):
        assert entry in ignored
    for name in ("cuda", "ascend"):
        text = _dockerfile(name)
        assert "COPY . ." in text and re.search(r"^CMD ", text, re.MULTILINE)
