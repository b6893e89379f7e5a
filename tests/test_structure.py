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
