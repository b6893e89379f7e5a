"""What env_setup.sh installs, as plain data: the torch stack per target, the NPU pairing with CANN,
and the project's own requirements. Standard library only (it runs before anything is installed,
on Python 3.10+), so env_setup.sh can call it with any interpreter.

    python scripts/install_plan.py torch --target npu --python-version 3.11 --arch x86_64 \
        [--cann-version 8.5.0 | --cann-home DIR] [--line recipe|current]  # pip arguments, one per line
    python scripts/install_plan.py cann-version [--cann-home DIR]   # the installed CANN version
    python scripts/install_plan.py set-env [--cann-home DIR]        # CANN's set_env.sh path
    python scripts/install_plan.py project [--with-parity] [--line recipe|current]  # project requirements
    python scripts/install_plan.py constraints [--line recipe|current]  # the line's constraints file
    python scripts/install_plan.py cpu-index                        # --extra-index-url for torch's CPU build, if reachable
    python scripts/install_plan.py platform-tags manylinux_2_28_aarch64  # tags that platform accepts
    python scripts/install_plan.py wheel-deps WHEEL --python-version 3.11 --arch aarch64
    python scripts/install_plan.py stub-wheel DIR NAME VERSION      # an empty wheel (see make_stub_wheel)

Errors go to stderr with the fix and exit status 2.

Two library lines (constraints/<line>.txt pins diffusers / transformers / peft): "recipe" (the
Ascend recipe's late-2024 pins, the default) and "current" (diffusers 0.42.1, transformers 5.x).

NPU facts (Ascend Extension for PyTorch README, "Version Matching Table", gitcode.com/Ascend/pytorch,
read from its master README and the v2.12.0 README; Python range from Ascend's version tables):
- recipe line, torch 2.7.1: torch-npu 2.7.1 pairs with CANN 8.3.RC1, 2.7.1.post2 with CANN 8.5.0,
  2.7.1.post4 with CANN 9.0.0; Python 3.9-3.11.
- current line: torch 2.9.0 with torch-npu 2.9.0 (CANN 8.5.0), torch 2.10.0 with torch-npu 2.10.0
  (CANN 9.0.0) and 2.10.0.post4 (CANN 9.1.0); Python 3.10-3.13 (the project tests 3.10-3.12).
x86_64 hosts take PyTorch's CPU build (torch==X+cpu from PyTorch's CPU wheel index); aarch64 hosts
(Atlas A3) take plain torch==X from PyPI.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINES = ("recipe", "current")
DEFAULT_LINE = "recipe"
NPU_TORCH = "2.7.1"
NPU_TORCHVISION = "0.22.1"
# torchvision release built for each torch release the NPU pairs use (torchvision's compatibility table).
TORCHVISION_FOR = {"2.7.1": "0.22.1", "2.9.0": "0.24.0", "2.10.0": "0.25.0"}
# line -> CANN version -> (torch, torch-npu built against both).
NPU_PAIRS = {
    "recipe": {"8.3.RC1": ("2.7.1", "2.7.1"), "8.5.0": ("2.7.1", "2.7.1.post2"), "9.0.0": ("2.7.1", "2.7.1.post4")},
    "current": {"8.5.0": ("2.9.0", "2.9.0"), "9.0.0": ("2.10.0", "2.10.0"), "9.1.0": ("2.10.0", "2.10.0.post4")},
}
# The recipe line's table under its historical name (torch 2.7.1).
CANN_TO_TORCH_NPU = {cann: npu for cann, (_, npu) in NPU_PAIRS["recipe"].items()}
# torch-npu 2.7.1 supports 3.9-3.11, 2.9/2.10 3.10-3.13; the project itself needs >= 3.10.
NPU_PYTHONS_BY_LINE = {"recipe": ("3.10", "3.11"), "current": ("3.10", "3.11", "3.12")}
NPU_PYTHONS = NPU_PYTHONS_BY_LINE["recipe"]
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# CANN's Python side (operator compiler, profiler): the Ascend recipe's list and pins.
CANN_PYTHON_DEPS = ("decorator", "sympy", "cffi", "attrs", "psutil", "scipy", "absl-py==2.3.1", "protobuf==3.20.0",
                    "pyyaml")
DEFAULT_CANN_HOMES = ("/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest")
# The parity test's packages with wheels (scripts/install_hpsv2_parity.sh); clint (and its dependency
# args) exist only as sources and hpsv2 goes in with --no-deps: download_wheels.sh fetches those apart.
PARITY_DEPS = ("ftfy", "regex", "braceexpand", "webdataset", "pandas")
# What `pip install -e .` needs to build the project offline (pyproject's build-system).
BUILD_DEPS = ("setuptools>=64", "wheel")


class PlanError(Exception):
    """Bad input; the message names the problem and the fix."""


def check_line(line: str) -> str:
    if line not in LINES:
        raise PlanError(f"unknown library line {line!r}: use --line recipe (diffusers 0.32, the default) or "
                        "--line current (diffusers 0.42)")
    return line


def constraints_file(line: str) -> Path:
    """The pins of a library line (constraints/<line>.txt)."""
    return ROOT / "constraints" / f"{check_line(line)}.txt"


def line_pins(line: str) -> list[str]:
    """The requirement lines of constraints/<line>.txt (comments dropped)."""
    lines = (raw.split("#", 1)[0].strip() for raw in constraints_file(line).read_text().splitlines())
    return [x for x in lines if x]


def cann_table(line: str = DEFAULT_LINE) -> str:
    rows = "\n".join(f"    CANN {c:<8} -> torch-npu {npu} (torch {t})" for c, (t, npu) in NPU_PAIRS[line].items())
    return f"supported CANN versions on the {line} line:\n{rows}"


def check_npu_python(version: str, line: str = DEFAULT_LINE) -> None:
    pythons = NPU_PYTHONS_BY_LINE[check_line(line)]
    if version not in pythons:
        raise PlanError(
            f"Python {version} cannot run the {line} line's torch-npu (supported here: Python {', '.join(pythons)}). "
            f"Create a Python 3.11 environment and run env_setup.sh from it:\n"
            f"    conda create -n flux_grpo python=3.11 && conda activate flux_grpo && bash env_setup.sh --target npu "
            f"--line {line}"
        )


def npu_pair_for(cann_version: str, line: str = DEFAULT_LINE) -> tuple[str, str]:
    """(torch, torch-npu) for a CANN version on a library line."""
    key = cann_version.strip()
    pairs = NPU_PAIRS[check_line(line)]
    if key not in pairs:
        other = [x for x in LINES if x != line and key in NPU_PAIRS[x]]
        hint = f" The {other[0]} line pairs with it: --line {other[0]}." if other else ""
        raise PlanError(
            f"no torch-npu release is known to pair with CANN {key!r} on the {line} line.{hint}\n{cann_table(line)}\n"
            "Install one of these CANN versions, or, if you know the pairing holds, force one with "
            f"--cann-version {next(iter(pairs))} (for example)."
        )
    return pairs[key]


def torch_npu_for(cann_version: str, line: str = DEFAULT_LINE) -> str:
    return npu_pair_for(cann_version, line)[1]


def _version_from_text(text: str) -> str | None:
    # ascend_toolkit_install.info / version.info: "version=8.5.0"; version.cfg may say "Version=...".
    m = re.search(r"^\s*version\s*[=:]\s*\[?([0-9][0-9A-Za-z.]*)", text, re.IGNORECASE | re.MULTILINE)
    return m.group(1) if m else None


def version_files(home: Path) -> list[Path]:
    """Where a CANN tree records its version, most specific first."""
    found = sorted(home.glob("*-linux/ascend_toolkit_install.info"))
    found += sorted(home.glob("*_install.info"))
    found += [home / n for n in ("version.info", "version.cfg") if (home / n).is_file()]
    return found


def find_cann_home(explicit: str | None) -> Path:
    candidates = [explicit] if explicit else [os.environ.get("ASCEND_TOOLKIT_HOME"),
                                              os.environ.get("ASCEND_HOME_PATH"), *DEFAULT_CANN_HOMES]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    tried = ", ".join(c for c in candidates if c)
    raise PlanError(f"no CANN installation found (tried {tried}). Install CANN first, or point at it with "
                    "--cann-home DIR, or name its version with --cann-version.")


def read_cann_version(home: Path) -> str:
    for f in version_files(home):
        v = _version_from_text(f.read_text(errors="replace"))
        if v:
            return v
    raise PlanError(f"cannot read the CANN version under {home} (looked for */ascend_toolkit_install.info, "
                    "*_install.info, version.info, version.cfg with a 'version=' line). Pass --cann-version X.")


def find_set_env(home: Path | None) -> Path:
    """CANN's set_env.sh: $CANN_SET_ENV when set, else beside the CANN tree (cann/ or ascend-toolkit/)."""
    override = os.environ.get("CANN_SET_ENV")
    candidates = [Path(override)] if override else [home / "set_env.sh", home.parent / "set_env.sh"]
    for c in candidates:
        if c.is_file():
            return c
    raise PlanError(f"CANN's set_env.sh is missing (tried {', '.join(map(str, candidates))}); without it "
                    "`import torch` fails once torch-npu is installed. Repair the CANN install, or set "
                    "CANN_SET_ENV=/path/to/set_env.sh.")


def torch_args(target: str, python_version: str, arch: str, cann_version: str | None = None,
               line: str = DEFAULT_LINE) -> list[str]:
    """pip install arguments for the torch stack of ``target`` (cpu | cuda | npu) on a library line."""
    check_line(line)
    if target in ("cpu", "cuda"):
        return ["torch>=2.7.1,<2.15", "torchvision>=0.22.1"]
    if target != "npu":
        raise PlanError(f"unknown target {target!r}; use cpu, cuda or npu")
    check_npu_python(python_version, line)
    if cann_version is None:
        raise PlanError("the NPU target needs the CANN version (read from the CANN tree, or --cann-version)")
    torch, npu = npu_pair_for(cann_version, line)
    vision = TORCHVISION_FOR[torch]
    if arch == "x86_64":
        # torch-npu's x86_64 wheels are built against PyTorch's CPU build, not PyPI's CUDA build.
        return [f"torch=={torch}+cpu", f"torchvision=={vision}+cpu", f"torch-npu=={npu}",
                *CANN_PYTHON_DEPS, "--extra-index-url", PYTORCH_CPU_INDEX]
    if arch == "aarch64":
        return [f"torch=={torch}", f"torchvision=={vision}", f"torch-npu=={npu}", *CANN_PYTHON_DEPS]
    raise PlanError(f"torch-npu has wheels for x86_64 and aarch64 only, not {arch!r}")


def cpu_index_args(url: str | None = None, timeout_s: float = 3.0) -> list[str]:
    """pip arguments that take torch's CPU build (about 0.2 GB instead of the CUDA build's 5.8 GB with
    its CUDA libraries) for --target cpu: ``--extra-index-url`` PyTorch's CPU index when it answers
    within ``timeout_s``, else nothing (PyPI's build is used). pip prefers ``torch==X+cpu`` over
    ``torch==X`` (a local version label sorts after the plain release). FLUX_GRPO_CPU_INDEX names
    another index, or 0 turns the probe off."""
    import urllib.request

    url = url or os.environ.get("FLUX_GRPO_CPU_INDEX") or PYTORCH_CPU_INDEX
    if url == "0":
        return []
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout_s) as reply:
            ok = 200 <= reply.status < 400
    except (OSError, ValueError):
        ok = False
    return ["--extra-index-url", url] if ok else []


def _toml_string_list(text: str, key: str) -> list[str]:
    """The strings of ``key = [ ... ]`` in pyproject.toml (a list of quoted strings, comments allowed)."""
    m = re.search(rf"^{re.escape(key)}\s*=\s*\[(.*?)\]", text, re.MULTILINE | re.DOTALL)
    if m is None:
        raise PlanError(f"pyproject.toml has no '{key} = [...]' list")
    body = "\n".join(line.split("#", 1)[0] for line in m.group(1).splitlines())
    return re.findall(r'"([^"]+)"', body)


# The extras env_setup.sh installs on every line (its `pip install -e ".[test,video]"`).
INSTALL_EXTRAS = ("test", "video")


def project_requirements(pyproject: Path, extras: tuple[str, ...] = INSTALL_EXTRAS, with_torch: bool = True) -> list[str]:
    """The project's dependencies plus ``extras`` (torch/torchvision dropped when with_torch is False:
    torch_args decides those per target)."""
    text = pyproject.read_text()
    reqs = _toml_string_list(text, "dependencies")
    for extra in extras:
        reqs += _toml_string_list(text, extra)
    if not with_torch:
        reqs = [r for r in reqs if re.split(r"[<>=!~ \[]", r, maxsplit=1)[0] not in ("torch", "torchvision")]
    return reqs


def platform_tags(tag: str) -> list[str]:
    """Every platform tag a machine of ``tag`` accepts, for pip download --platform (pip itself widens
    only the legacy manylinux2014/2010 names): manylinux_2_28_aarch64 also takes manylinux_2_17 ... wheels."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if m is None:
        return [tag]
    glibc, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 16, -1)]
    return tags + [f"manylinux2014_{arch}"]


def wheel_requirements(wheel: Path, python_version: str, arch: str) -> list[str]:
    """A wheel's Requires-Dist that hold on a Linux ``arch`` machine running CPython ``python_version``.
    pip download --platform evaluates markers for the machine it runs on (so it would fetch x86_64-only
    dependencies such as triton for an aarch64 target); this evaluates them for the target instead."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # every pip vendors packaging
        from pip._vendor.packaging.requirements import Requirement
    env = {"platform_machine": arch, "python_version": python_version, "python_full_version": f"{python_version}.0",
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate(env):
            req.marker = None
            out.append(str(req))
    return out


def make_stub_wheel(out_dir: Path, name: str, version: str) -> Path:
    """An empty wheel with no dependencies that stands for a package already installed on the target
    (torch on an accelerator box): resolving against it downloads everything else but that package."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: flux-grpo install_plan\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, body in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(body.encode())}")
    record.append(f"{info}/RECORD,,")
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, body in files.items():
            z.writestr(path, body)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--target", required=True)
    t.add_argument("--python-version", required=True)
    t.add_argument("--arch", required=True)
    t.add_argument("--cann-version")
    t.add_argument("--cann-home")
    t.add_argument("--line", default=DEFAULT_LINE)
    for name in ("cann-version", "set-env"):
        sub.add_parser(name).add_argument("--cann-home")
    sub.add_parser("platform-tags").add_argument("tag")
    w = sub.add_parser("wheel-deps")
    w.add_argument("wheel")
    w.add_argument("--python-version", required=True)
    w.add_argument("--arch", required=True)
    p = sub.add_parser("project")
    p.add_argument("--with-parity", action="store_true")
    p.add_argument("--line", default=DEFAULT_LINE)
    sub.add_parser("constraints").add_argument("--line", default=DEFAULT_LINE)
    sub.add_parser("cpu-index")
    s = sub.add_parser("stub-wheel")
    s.add_argument("dir")
    s.add_argument("name")
    s.add_argument("version")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "torch":
            cann = args.cann_version
            if args.target == "npu" and cann is None:
                check_npu_python(args.python_version, check_line(args.line))
                cann = read_cann_version(find_cann_home(args.cann_home))
            lines = torch_args(args.target, args.python_version, args.arch, cann, args.line)
        elif args.cmd == "cann-version":
            lines = [read_cann_version(find_cann_home(args.cann_home))]
        elif args.cmd == "set-env":
            home = None if os.environ.get("CANN_SET_ENV") else find_cann_home(args.cann_home)
            lines = [str(find_set_env(home))]
        elif args.cmd == "project":
            lines = project_requirements(ROOT / "pyproject.toml", with_torch=False) + list(BUILD_DEPS)
            lines += line_pins(args.line)
            if args.with_parity:
                lines += list(PARITY_DEPS)
        elif args.cmd == "cpu-index":
            lines = cpu_index_args()
        elif args.cmd == "constraints":
            lines = [str(constraints_file(args.line))]
        elif args.cmd == "wheel-deps":
            lines = wheel_requirements(Path(args.wheel), args.python_version, args.arch)
        elif args.cmd == "platform-tags":
            lines = platform_tags(args.tag)
        else:
            lines = [str(make_stub_wheel(Path(args.dir), args.name, args.version))]
    except PlanError as err:
        print(f"env_setup.sh: {err}", file=sys.stderr)
        return 2
    if lines:  # nothing at all when there is nothing (cpu-index off or unreachable), not a blank line
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
