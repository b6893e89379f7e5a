"""The import name ``fastvideo`` is this project's and also hao-ai-lab's FastVideo's (the ``fastvideo``
distribution on PyPI). Installed in the same environment, the other one's package can stand where
``import fastvideo`` looks first, and a run fails far from the cause (or runs the wrong code).

``env_setup.sh`` (before installing) and the start-up of the trainer and of ``fastvideo.launch``
ask ``problem()``: a distribution other than flux-grpo that installs the top-level ``fastvideo``
(its ``top_level.txt``, else its ``RECORD``), or, at start-up, a ``fastvideo`` that resolves to a
folder other than this one. Each stops with one line saying what to do (``pip uninstall``) and
exit status 2 (EXIT_CODE, fastvideo.errors.USER_ERROR_EXIT).

Standard library only, and nothing of the package: it runs by path (``python fastvideo/import_name.py``)
before the project is installed, and where ``fastvideo`` may be the other project's. Cost: one small
metadata file read per installed distribution (about 0.1 s for 100 distributions).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # run by path: this folder (the package's modules) must not shadow the standard library
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

EXIT_CODE = 2  # fastvideo.errors.USER_ERROR_EXIT: something the user fixes
OUR_DISTRIBUTION = "flux-grpo"
PACKAGE = "fastvideo"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _canonical(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _installs_package(dist) -> bool:
    """Whether a distribution installs the top-level ``fastvideo`` (top_level.txt, else RECORD)."""
    top = dist.read_text("top_level.txt")
    if top is not None:
        return PACKAGE in top.split()
    record = dist.read_text("RECORD") or ""
    return any(line.split("/", 1)[0] == PACKAGE and "/" in line for line in record.splitlines())


def foreign_distributions(path: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(name, version, folder) of each installed distribution other than flux-grpo that installs
    the top-level ``fastvideo``, on ``path`` (default sys.path), each once."""
    from importlib import metadata

    found: dict[tuple[str, str], str] = {}
    for dist in metadata.distributions(path=path if path is not None else sys.path):
        if not _installs_package(dist):
            continue
        name = dist.metadata["Name"] or "?"
        if _canonical(name) == OUR_DISTRIBUTION:
            continue
        where = str(dist.locate_file(""))
        found.setdefault((name, dist.version or "?"), where)
    return [(name, version, where) for (name, version), where in found.items()]


def resolved_origin() -> str | None:
    """Where ``import fastvideo`` loads from here (the loaded module's file, else the finder's
    answer, importing nothing), None when it finds nothing."""
    module = sys.modules.get(PACKAGE)
    if module is not None and getattr(module, "__file__", None):
        return os.path.abspath(module.__file__)
    import importlib.util

    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    return os.path.abspath(spec.origin) if spec is not None and spec.origin else None


def problem(check_origin: bool = False, path: list[str] | None = None) -> str | None:
    """One line saying what to do when another ``fastvideo`` is installed (or, with
    ``check_origin``, when ``import fastvideo`` resolves outside this folder), else None."""
    foreign = foreign_distributions(path)
    if foreign:
        names = ", ".join(f"{n} {v} in {w}" for n, v, w in foreign)
        uninstall = " ".join(sorted({n for n, _, _ in foreign}))
        return (f"another package installs the import name 'fastvideo' in this environment ({names}; hao-ai-lab's "
                f"FastVideo is 'fastvideo' on PyPI) and can shadow flux-grpo's: remove it with "
                f"`{sys.executable} -m pip uninstall {uninstall}` (or give it an environment of its own)")
    if check_origin:
        origin = resolved_origin()
        if origin is not None and os.path.dirname(origin) != PACKAGE_DIR:
            return (f"'import fastvideo' loads {origin}, not flux-grpo's {PACKAGE_DIR}: remove that package "
                    f"(pip uninstall fastvideo) or the PYTHONPATH entry that puts it first")
    return None


def main(argv: list[str] | None = None) -> int:
    """``python fastvideo/import_name.py [--origin] [--prefix WORDS]``: the problem on one line of
    stderr and EXIT_CODE, else nothing and 0."""
    args = list(sys.argv[1:] if argv is None else argv)
    prefix = "flux-grpo"
    if "--prefix" in args:
        prefix = args[args.index("--prefix") + 1]
    line = problem(check_origin="--origin" in args)
    if line is None:
        return 0
    print(f"{prefix}: {line}", file=sys.stderr, flush=True)
    return EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
