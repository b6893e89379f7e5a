"""The diffusers patch series (patches/diffusers-<version>/) and the NPU shell helpers.

One series per diffusers release: 0.32.0 (the recipe line) and 0.42.1 (the current line). The
network test downloads the release's source distribution once (cached under ~/.cache/flux_grpo/, or
$FLUX_GRPO_CACHE), applies the series with scripts/apply_diffusers_patches.sh (git am), and runs
tests/patched_diffusers/check_<version>.py in subprocesses with that line's interpreter: first on
the stock diffusers it has installed (the reference outputs), then on the patched tree without
torch_npu (it must compute exactly the same), with a torch_npu that fails on import (diffusers must
still import) and with the stand-in torch_npu (tests/npu_stub.py; the fused kernels must be taken
and agree). Each line's suite tests the series of the diffusers it installs and skips the other
with the reason, unless the other line's interpreter is given (FLUX_GRPO_RECIPE_PYTHON,
FLUX_GRPO_CURRENT_PYTHON).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
PATCHES = REPO / "patches"
PATCH_NAME = re.compile(r"^(\d{4})-(bugfix|feature)-([a-z0-9]+(?:_[a-z0-9]+)*)\.patch$")
# release -> (the library line that installs it, the variable naming that line's interpreter)
LINES = {"0.32.0": ("recipe", "FLUX_GRPO_RECIPE_PYTHON"), "0.42.1": ("current", "FLUX_GRPO_CURRENT_PYTHON")}
VERSIONS = sorted(LINES)


def _series_dir(version: str) -> Path:
    return PATCHES / f"diffusers-{version}"


def _patches(version: str) -> list[Path]:
    return sorted(_series_dir(version).glob("*.patch"))


def test_one_series_per_supported_release():
    found = sorted(p.name for p in PATCHES.iterdir() if p.is_dir())
    assert found == [f"diffusers-{v}" for v in VERSIONS], found
    assert sorted(p.name for p in PATCHES.iterdir() if not p.is_dir()) == ["README.md"]


@pytest.mark.parametrize("version", VERSIONS)
def test_patch_names_and_numbering(version):
    patches, folder = _patches(version), _series_dir(version)
    assert patches, f"no patches in {folder}"
    for index, path in enumerate(patches, start=1):
        match = PATCH_NAME.match(path.name)
        assert match, f"{path.name} is not NNNN-(bugfix|feature)-snake_case_description.patch"
        assert int(match.group(1)) == index, f"{path.name}: expected number {index:04d} (no gaps)"
    assert not [p for p in folder.iterdir() if p.suffix != ".patch"], "only .patch files belong here"


@pytest.mark.parametrize("version", VERSIONS)
def test_patches_are_git_format_patch_matching_their_names(version):
    patches = _patches(version)
    for index, path in enumerate(patches, start=1):
        text = path.read_text()
        assert text.startswith("From "), f"{path.name} is not a git format-patch file"
        kind, description = PATCH_NAME.match(path.name).group(2, 3)
        subject = f"Subject: [PATCH {index}/{len(patches)}] {kind}: {description}\n"
        assert subject in text, f"{path.name}: expected '{subject.strip()}'"
        touched = re.findall(r"^diff --git a/(\S+) b/", text, flags=re.M)
        assert touched and all(f.startswith("src/diffusers/") for f in touched), touched


def test_npu_env_defaults_overrides_and_missing_cann(tmp_path):
    fake_cann = tmp_path / "set_env.sh"
    fake_cann.write_text('export FAKE_CANN=loaded\nexport LD_LIBRARY_PATH="/cann/lib:$LD_LIBRARY_PATH"\n')
    show = (
        "source scripts/npu_env.sh; "
        "echo $TASK_QUEUE_ENABLE $HCCL_BUFFSIZE ${FAKE_CANN:-none} $- $PYTORCH_NPU_ALLOC_CONF"
    )
    ours = ("LD_LIBRARY_PATH", "CANN_SET_ENV", "TASK_QUEUE_ENABLE", "HCCL_BUFFSIZE", "PYTORCH_NPU_ALLOC_CONF")
    env = {k: v for k, v in os.environ.items() if k not in ours}

    def run(**extra):
        return subprocess.run(
            ["bash", "-c", f"set -euo pipefail; {show}"],
            cwd=REPO, env={**env, **extra}, capture_output=True, text=True, check=True,
        )

    loaded = run(HCCL_BUFFSIZE="400", CANN_SET_ENV=str(fake_cann))
    queue, buffsize, cann, flags, alloc = loaded.stdout.split()
    assert (queue, buffsize, cann, alloc) == ("2", "400", "loaded", "expandable_segments:True")
    assert "u" in flags  # the caller's `set -u` survives CANN's script
    missing = run(CANN_SET_ENV=str(tmp_path / "absent.sh"))
    assert missing.stdout.split()[1:3] == ["800", "none"]
    assert "not found" in missing.stderr and "CANN_SET_ENV" in missing.stderr


def test_apply_script_refuses_non_empty_target(tmp_path):
    (tmp_path / "something").write_text("x")
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "apply_diffusers_patches.sh"), "--no-install", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert result.returncode != 0 and "not empty" in result.stderr


def test_apply_script_refuses_a_release_without_series(tmp_path):
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "apply_diffusers_patches.sh"), "--no-install", "--version", "0.31.0",
         str(tmp_path / "d")],
        capture_output=True, text=True,
    )
    assert result.returncode == 2, result.stderr
    assert "no patch series for diffusers 0.31.0" in result.stderr and " ".join(VERSIONS) in result.stderr
    assert not (tmp_path / "d").exists()


# ------------------------------------------------------------------------------ network: git am


def _cached_sdist(version: str) -> Path:
    cache = Path(os.environ.get("FLUX_GRPO_CACHE", Path.home() / ".cache" / "flux_grpo"))
    sdist = cache / f"diffusers-{version}.tar.gz"
    if sdist.is_file():
        return sdist
    download = cache / f".download-{os.getpid()}"
    download.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"diffusers=={version}", "-d", str(download)],
            check=True, timeout=300,
        )
        os.replace(download / sdist.name, sdist)
    finally:
        shutil.rmtree(download, ignore_errors=True)
    return sdist


def _line_python(version: str) -> str:
    """The interpreter of the line that installs diffusers ``version``: this one, the one named by
    the line's variable, or a skip saying which line runs the check."""
    import diffusers

    if diffusers.__version__ == version:
        return sys.executable
    line, variable = LINES[version]
    python = os.environ.get(variable)
    if not python:
        pytest.skip(f"the diffusers {version} series is tested by the {line} line's suite (its interpreter has "
                    f"diffusers {version}, this one {diffusers.__version__}); set {variable} to run it here")
    return python


def _run_python(python: str, args: list[str], path: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([python, *args], env=env, capture_output=True, text=True, timeout=180, cwd=cwd)


def _run_check(python: str, version: str, mode: str, args: list[Path], path: list[Path], cwd: Path) -> str:
    script = TESTS / "patched_diffusers" / f"check_{version.replace('.', '_')}.py"
    result = _run_python(python, [str(script), mode, *map(str, args)], path, cwd)
    assert result.returncode == 0, f"{mode} check failed:\n{result.stdout}\n{result.stderr}"
    assert f"{mode} ok" in result.stdout, result.stdout
    return result.stdout


def _torch_npu_metadata(directory: Path) -> None:
    """What pip leaves next to an installed torch_npu (diffusers 0.42 asks the metadata first)."""
    dist_info = directory / "torch_npu-2.7.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.7.1\n")


def _broken_torch_npu(directory: Path) -> Path:
    """torch_npu 'installed' (metadata present) but failing on import, as without CANN."""
    directory.mkdir()
    (directory / "torch_npu.py").write_text(
        "raise OSError('libhccl.so: cannot open shared object file (stand-in: no CANN here)')\n"
    )
    _torch_npu_metadata(directory)
    return directory


def _stub_torch_npu(directory: Path, version: str) -> Path:
    """The stand-in importable as torch_npu; with metadata for 0.42.1, which gates on it (the 0.32.0
    series imports torch_npu itself and its check expects no metadata, as when it was written)."""
    directory.mkdir()
    (directory / "torch_npu.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom npu_stub import *  # noqa: F401,F403\n"
    )
    if version != "0.32.0":
        _torch_npu_metadata(directory)
    return directory


def _apply_series(version: str, python: str, target: Path) -> None:
    subprocess.run(
        ["bash", str(REPO / "scripts" / "apply_diffusers_patches.sh"), "--no-install", "--version", version,
         str(target)],
        env={**os.environ, "DIFFUSERS_SDIST": str(_cached_sdist(version)), "PYTHON": python},
        check=True, capture_output=True, timeout=120,
    )
    log = subprocess.run(
        ["git", "log", "--format=%s", f"v{version}..HEAD"], cwd=target, capture_output=True, text=True,
        check=True,
    ).stdout.split("\n")[:-1]
    assert log[::-1] == [": ".join(PATCH_NAME.match(p.name).group(2, 3)) for p in _patches(version)]


@pytest.mark.network
@pytest.mark.parametrize("version", VERSIONS)
def test_series_applies_with_git_am_and_patched_diffusers_behaves(version, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    python = _line_python(version)
    target = tmp_path / "diffusers"
    _apply_series(version, python, target)
    src = target / "src"
    checks = TESTS / "patched_diffusers"

    # Reference outputs from the line's own stock diffusers (no PYTHONPATH to the patched tree).
    ref_path = tmp_path / "stock_reference.pt"
    _run_check(python, version, "reference", [ref_path], [checks], tmp_path)

    # Without torch_npu: bit-identical to the stock release.
    _run_check(python, version, "plain", [ref_path, src], [src, checks], tmp_path)

    # torch_npu installed without CANN: stock diffusers fails to import, the patched one works.
    broken = _broken_torch_npu(tmp_path / "broken")
    stock = _run_python(python, ["-c", "import diffusers.models.attention_processor"], [broken], tmp_path)
    assert stock.returncode != 0 and "OSError" in stock.stderr, stock.stderr
    _run_check(python, version, "broken", [ref_path, src], [src, broken, checks], tmp_path)

    # With the stand-in torch_npu importable: fused kernels taken, same results.
    stub = _stub_torch_npu(tmp_path / "stub", version)
    _run_check(python, version, "stub", [ref_path, src], [src, stub, checks], tmp_path)
