"""The package's shape (tools/structure.py): no import cycles between modules, sub-packages or
rooms (the registries' import-by-name included), no function over 80 lines, no file over 500,
and fastvideo/config.py, the composition of the components, under 200."""

from __future__ import annotations

from pathlib import Path

from tools_loader import load_tool

ROOT = Path(__file__).resolve().parents[1]
structure = load_tool("structure")


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_a_registry_importing_its_implementations_by_name_is_a_cycle(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "models/__init__.py": "",
        "models/base.py": "import importlib\n\ndef load():\n    importlib.import_module('pkg.models.flux')\n",
        "models/flux/__init__.py": "from pkg.models.flux.family import Flux\n",
        "models/flux/family.py": "from pkg.models.base import load\nclass Flux: pass\n",
        "long.py": "def f():\n" + "    x = 1\n" * 80,
    })
    report = structure.check(str(pkg))
    assert report.module_cycles == [["pkg.models.base", "pkg.models.flux", "pkg.models.flux.family"]]
    assert report.subpackage_cycles == []  # all inside pkg.models
    assert structure.imports_between(report.edges, "pkg.models.flux", "pkg.models.base") == [
        "pkg.models.flux.family -> pkg.models.base"]
    assert [w.split(" ")[1] for _, w in report.long_functions] == ["f"]
    assert structure.check(str(pkg), file_limits={str(pkg / "long.py"): 50}).long_files == [(81, str(pkg / "long.py"))]
    assert not report.clean


def test_a_registry_table_of_names_is_an_import_and_a_logger_name_is_not(tmp_path):
    """Registrations by name: "module:Attr" strings and ("module", "Attr") pairs reach the module
    (the reward registry's table); a bare module name (a logger's, python -m's) does not."""
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "rewards/__init__.py": "",
        "rewards/base.py": "TABLE = {'hps': 'pkg.rewards.hps:HPS'}\n",
        "rewards/hps.py": "from pkg.rewards.base import TABLE\nclass HPS: pass\n",
        "models/__init__.py": "",
        "models/base.py": "TABLE = {'flux': ('pkg.models.flux', 'Flux')}\n",
        "models/flux.py": "import logging\nfrom pkg.models.base import TABLE\nlog = logging.getLogger('pkg.models.base')\n",
        "tools/__init__.py": "",
        "tools/a.py": "import logging\nlog = logging.getLogger('pkg.tools.b')\n",
        "tools/b.py": "from pkg.tools import a\nCMD = ['python', '-m', 'pkg.tools.a']\n",
    })
    report = structure.check(str(pkg))
    assert report.module_cycles == [["pkg.models.base", "pkg.models.flux"], ["pkg.rewards.base", "pkg.rewards.hps"]]


def _loop_imports(report, room: str, allowed: tuple[str, ...]) -> list[str]:
    """Imports from a room of fastvideo/training/ into the loop (training's own modules) or into a
    room it may not use."""
    found = structure.imports_between(report.edges, room, "fastvideo.training")
    return [e for e in found if not any(e.split(" -> ")[1].startswith(a) for a in (room, *allowed))]


def test_fastvideo_has_no_cycles_no_long_functions_and_no_long_files():
    report = structure.check(str(ROOT / "fastvideo"), max_function=80, max_file=500,
                             file_limits={str(ROOT / "fastvideo" / "config.py"): 199})
    print(structure.render(report, 80, 500))
    assert report.module_cycles == []  # the family and objective registries' imports included
    assert report.subpackage_cycles == []
    assert report.long_functions == []
    assert report.long_files == []  # config.py: under 200 lines


def test_the_rooms_of_training_import_nothing_of_the_loop():
    """fastvideo/training/ holds the loop; checkpoint I/O (training/checkpoint/) and the run around
    it (training/run/, which may read checkpoints) never import the loop's modules."""
    report = structure.check(str(ROOT / "fastvideo"))
    assert _loop_imports(report, "fastvideo.training.checkpoint", ()) == []
    assert _loop_imports(report, "fastvideo.training.run", ("fastvideo.training.checkpoint",)) == []
    assert structure.imports_between(report.edges, "fastvideo.models.base", "fastvideo.models.registry") == []


def test_no_two_test_files_share_a_name():
    """tests/ has no __init__.py files: pytest imports each test file as a top-level module named
    after its file, so two files of one name in different folders fail to import together
    ("import file mismatch") and one of them never runs in the full suite."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not clashes, "test files of the same name: " + "; ".join(clashes)
