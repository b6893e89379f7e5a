#!/usr/bin/env python3
"""The shape of a Python package: import cycles, long functions, long files.

    python tools/structure.py [PACKAGE_DIR=fastvideo] [--max-function 80] [--max-file 500]
                              [--file fastvideo/config.py:200 ...]

Reads the source only (ast) and runs nothing. An import is a dependency wherever it is written
(a lazy import inside a function still is), and so is ``importlib.import_module("a.b")`` with a
literal name, or a string "a.b:Attr" or a pair ("a.b", "Attr") naming a module: a registry
that imports its implementations by name while they import the registry is a circle however the
import is spelt. Cycles are reported between modules and between the
package's sub-packages (``fastvideo.training`` as a whole); ``Report.edges`` and ``imports_between``
let a test hold finer layering rules (a room of a sub-package that must not import another).

Exit status: 0 when every count is zero, 1 otherwise. tests/test_structure.py runs it on fastvideo/.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Module:
    name: str  # dotted, e.g. fastvideo.training.trainer (a package: its __init__'s name, fastvideo.training)
    path: str
    tree: ast.Module
    lines: int

    @property
    def is_package(self) -> bool:
        return os.path.basename(self.path) == "__init__.py"


@dataclass
class Report:
    modules: int
    lines: int
    module_cycles: list[list[str]]
    subpackage_cycles: list[list[str]]
    long_functions: list[tuple[int, str]]  # (lines, "path:line name")
    long_files: list[tuple[int, str]]  # (lines, path), over the limit for all files or the file's own
    edges: dict[str, set[str]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (self.module_cycles or self.subpackage_cycles or self.long_functions or self.long_files)


def read_modules(pkg_dir: str) -> dict[str, Module]:
    """Every .py file under ``pkg_dir`` by dotted module name."""
    root = os.path.dirname(os.path.abspath(pkg_dir))
    out = {}
    for folder, _, files in os.walk(pkg_dir):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
            name = name[:-len(".__init__")] if name.endswith(".__init__") else name
            text = open(path, encoding="utf-8").read()
            out[name] = Module(name, path, ast.parse(text, path), len(text.splitlines()))
    return out


def _targets(mod: Module, node: ast.AST, names: set[str]) -> list[str]:
    """The module names one import statement (or literal importlib call) in ``mod`` reaches."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = mod.name if mod.is_package else mod.name.rpartition(".")[0]
        for _ in range(max(node.level - 1, 0)):
            base = base.rpartition(".")[0]
        target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
        # `from pkg import submodule` reaches the submodule (pkg itself only for names it defines)
        subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in names]
        return subs + ([target] if len(subs) < len(node.names) else [])
    if isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return [arg.value]
    return _registered_by_name(node, names)


def _registered_by_name(node: ast.AST, names: set[str]) -> list[str]:
    """A registration by name: a string "module:Attr" naming one of the package's modules, or a
    pair ("module", "Attr") of strings (a registry's table of what it imports when asked, e.g.
    "fastvideo.rewards.hps:HPSv2Reward"), is an import of that module wherever it is written. A bare
    module name is not (a logger's name, ``python -m module`` in a subprocess)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        module, sep, attr = node.value.partition(":")
        return [module] if sep and module in names and attr.isidentifier() else []
    if isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        module, attr = (e.value for e in node.elts)
        return [module] if module in names and attr.isidentifier() else []
    return []


def _is_import_call(func: ast.AST) -> bool:
    """importlib.import_module(...), import_module(...) or __import__(...)."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def import_edges(mods: dict[str, Module], pkg: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports (the nearest existing module of a dotted name)."""
    names = set(mods)
    edges: dict[str, set[str]] = defaultdict(set)
    for m, mod in mods.items():
        for node in ast.walk(mod.tree):
            for t in _targets(mod, node, names):
                while t and t not in names and "." in t:
                    t = t.rpartition(".")[0]
                if t in names and t != m and t != pkg:
                    edges[m].add(t)
    return edges


def strongly_connected(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one node (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def unit_cycles(mods: dict[str, Module], edges: dict[str, set[str]], unit) -> list[list[str]]:
    """Cycles between groups of modules (``unit(module) -> group name``)."""
    grouped: dict[str, set[str]] = defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            if unit(a) != unit(b):
                grouped[unit(a)].add(unit(b))
    return strongly_connected(sorted({unit(m) for m in mods}), grouped)


def imports_between(edges: dict[str, set[str]], importer: str, imported: str) -> list[str]:
    """"a -> b" for each module under the dotted prefix ``importer`` that imports one under
    ``imported`` (a prefix names the module itself and everything below it)."""
    def under(m: str, prefix: str) -> bool:
        return m == prefix or m.startswith(prefix + ".")

    return sorted(f"{a} -> {b}" for a, bs in edges.items() if under(a, importer)
                  for b in bs if under(b, imported))


def long_functions(mods: dict[str, Module], limit: int) -> list[tuple[int, str]]:
    out = []
    for mod in mods.values():
        for node in ast.walk(mod.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append((n, f"{mod.path}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def check(pkg_dir: str, max_function: int = 80, max_file: int = 500,
          file_limits: dict[str, int] | None = None) -> Report:
    """The report for the package at ``pkg_dir``; ``file_limits``: {path: its own line limit}."""
    pkg = os.path.basename(os.path.normpath(pkg_dir))
    mods = read_modules(pkg_dir)
    edges = import_edges(mods, pkg)

    def subpackage(m: str) -> str:  # fastvideo.training.checkpoint.files -> fastvideo.training
        return ".".join(m.split(".")[:2])

    limits = {os.path.normpath(p): n for p, n in (file_limits or {}).items()}
    long_files = [(mod.lines, mod.path) for mod in mods.values()
                  if mod.lines > min(max_file, limits.get(os.path.normpath(mod.path), max_file))]
    return Report(
        modules=len(mods), lines=sum(m.lines for m in mods.values()),
        module_cycles=strongly_connected(sorted(mods), edges),
        subpackage_cycles=unit_cycles(mods, edges, subpackage),
        long_functions=long_functions(mods, max_function),
        long_files=sorted(long_files, reverse=True), edges=edges)


def render(r: Report, max_function: int, max_file: int) -> str:
    lines = [f"{r.modules} modules, {r.lines} lines"]
    for title, cycles in (("module cycles", r.module_cycles), ("sub-package cycles", r.subpackage_cycles)):
        lines.append(f"{title}: {len(cycles)}")
        lines += ["  " + " <-> ".join(c) for c in cycles]
    lines.append(f"functions over {max_function} lines: {len(r.long_functions)}")
    lines += [f"  {n:4d} {w}" for n, w in r.long_functions]
    lines.append(f"files over their limit ({max_file} lines, or the file's own): {len(r.long_files)}")
    lines += [f"  {n:4d} {p}" for n, p in r.long_files]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("package", nargs="?", default="fastvideo")
    ap.add_argument("--max-function", type=int, default=80)
    ap.add_argument("--max-file", type=int, default=500)
    ap.add_argument("--file", action="append", default=[], metavar="PATH:LINES",
                    help="a file's own (lower) line limit, e.g. fastvideo/config.py:200")
    a = ap.parse_args(argv)
    limits = {p: int(n) for p, _, n in (f.rpartition(":") for f in a.file)}
    report = check(a.package, a.max_function, a.max_file, limits)
    print(render(report, a.max_function, a.max_file))
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
