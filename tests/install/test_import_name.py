"""Another project's `fastvideo` (hao-ai-lab's FastVideo, `fastvideo` 0.2.1 on PyPI) installed beside
this one: env_setup.sh, the trainer and the launcher stop with one line naming it and the uninstall
command, exit 2. The foreign distribution is a fake one made in a temporary site folder (no network)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fake_distribution(site: Path, name: str = "fastvideo", version: str = "0.2.1", top_level: bool = True,
                      package: str = "fastvideo") -> Path:
    """A wheel-installed distribution as pip leaves it: the package folder and its dist-info
    (METADATA, RECORD, top_level.txt as setuptools writes it, or none as other backends do)."""
    (site / package).mkdir(parents=True, exist_ok=True)
    (site / package / "__init__.py").write_text("FOREIGN = True\n")
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\nSummary: FastVideo\n")
    (info / "RECORD").write_text(f"{package}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    if top_level:
        (info / "top_level.txt").write_text(f"comfyui\n{package}\nfastvideo-kernel\n")
    return site


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "VIRTUAL_ENV"))}
    env.update(FASTVIDEO_DEVICE="cpu", **extra)
    return env


def test_a_foreign_distribution_is_found_and_ours_is_not(tmp_path):
    sys.path.insert(0, str(ROOT / "fastvideo"))
    try:
        import import_name  # by path, as env_setup.sh runs it (standard library only)
    finally:
        sys.path.pop(0)
    from fastvideo.errors import USER_ERROR_EXIT

    assert import_name.EXIT_CODE == USER_ERROR_EXIT
    foreign = fake_distribution(tmp_path / "a")
    line = import_name.problem(path=[str(foreign)])
    assert f"fastvideo 0.2.1 in {foreign}" in line and f"{sys.executable} -m pip uninstall fastvideo`" in line
    assert "\n" not in line
    ours = fake_distribution(tmp_path / "b", name="flux-grpo", version="0.1.0")
    assert import_name.problem(path=[str(ours)]) is None
    no_top = fake_distribution(tmp_path / "c", name="fastvideo-fork", top_level=False)  # a non-setuptools wheel
    assert import_name.foreign_distributions([str(no_top)]) == [("fastvideo-fork", "0.2.1", str(no_top))]
    other = fake_distribution(tmp_path / "d", name="fastvideo-kernel", package="fastvideo_kernel", top_level=False)
    assert import_name.problem(path=[str(other)]) is None
    assert import_name.foreign_distributions([str(foreign), str(foreign)]) == [("fastvideo", "0.2.1", str(foreign))]


def test_env_setup_stops_before_installing(env, tmp_path):
    venv, e, log = env
    site = Path(subprocess.check_output([str(venv / "bin/python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    fake_distribution(site)
    r = subprocess.run(["bash", str(ROOT / "env_setup.sh"), "--target", "cpu", "--venv", str(venv)], env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and not log.exists()
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("env_setup.sh: another package installs the import name")
    assert f"{venv / 'bin' / 'python'} -m pip uninstall fastvideo" in r.stderr


def test_the_trainer_and_the_launcher_stop_at_start_up(tmp_path):
    site = fake_distribution(tmp_path / "site")
    env = _env(PYTHONPATH=f"{ROOT}{os.pathsep}{site}")  # this tree's fastvideo first, the foreign one installed
    for module, prog in (("fastvideo.train_grpo_flux", "train_grpo_flux"), ("fastvideo.launch", "train_grpo_flux")):
        r = subprocess.run([sys.executable, "-m", module, "--nproc_per_node", "1", "fastvideo/train_grpo_flux.py"]
                           if module.endswith("launch") else [sys.executable, "-m", module, "--help"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stderr[-2000:]
        assert r.stderr.startswith(f"{prog}: error: another package installs the import name 'fastvideo'")
        assert r.stderr.count("\n") == 1 and "pip uninstall fastvideo" in r.stderr and not r.stdout
    # a `fastvideo` without metadata first on the path (a checkout on PYTHONPATH): named by where it loads from
    shadow = tmp_path / "checkout"
    (shadow / "fastvideo").mkdir(parents=True)
    (shadow / "fastvideo" / "__init__.py").write_text("")
    r = subprocess.run([sys.executable, str(ROOT / "fastvideo" / "import_name.py"), "--origin"], cwd=tmp_path,
                       env=_env(PYTHONPATH=str(shadow)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr == (f"flux-grpo: 'import fastvideo' loads {shadow / 'fastvideo' / '__init__.py'}, not flux-grpo's "
                        f"{ROOT / 'fastvideo'}: remove that package (pip uninstall fastvideo) or the PYTHONPATH entry "
                        "that puts it first\n")
    r = subprocess.run([sys.executable, str(ROOT / "fastvideo" / "import_name.py"), "--origin"], cwd=tmp_path,
                       env=_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stderr) == (0, "")
