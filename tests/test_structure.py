"""The package's structure: no import cycles between phalanx's modules (pure logic, no imports).

Every ``import`` statement counts, at module level or inside a function: a function-level import
hides a cycle from Python's import machinery, not from the design.  Imports by string
(``importlib.import_module``) are not seen, nor those under ``if TYPE_CHECKING:``: they name a
type for the checker (a ``RunContext`` field's class, a callback's argument) and never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kernel_ext" / "phalanx"


def module_files(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (``__init__`` is the package)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that module ``name`` imports."""
    # a package's own relative imports start from itself, a module's from its package
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    type_only = {id(n) for block in ast.walk(tree) if _is_type_checking_block(block)
                 for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                # ``from pkg import sub`` imports the submodule; ``from mod import name``, mod
                found.add(submodule if submodule in modules else base)
    return {m for m in found if m in modules and m != name}


def _is_type_checking_block(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports only the type checker sees."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    files = module_files(root)
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every elementary cycle, each as a tuple starting at its smallest module name."""
    found: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                found.add(tuple(path))
            elif nxt > start and nxt not in path:  # each cycle is found from its smallest name
                walk(start, nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


def test_the_graph_resolves_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("from .. import a\nimport pkg.sub.c\nimport os\n")
    (pkg / "sub" / "c.py").write_text("from ..sub import VALUE\n"  # a name: the package
                                      "if TYPE_CHECKING:\n    from . import b\n")  # type only
    assert import_graph(pkg) == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.sub.b"},
                                 "pkg.sub": {"pkg.sub.b"}, "pkg.sub.b": {"pkg.a", "pkg.sub.c"},
                                 "pkg.sub.c": {"pkg.sub"}}
    assert cycles(import_graph(pkg)) == {("pkg.a", "pkg.sub.b"),
                                         ("pkg.sub", "pkg.sub.b", "pkg.sub.c")}


def describe(cycle: tuple[str, ...]) -> str:
    """``a -> b -> a``, without the package's name."""
    return " -> ".join(name.removeprefix(PACKAGE.name + ".") for name in cycle + cycle[:1])


KNOWN_CYCLES: set[str] = set()


def test_there_are_no_import_cycles_between_modules_but_the_known_ones():
    found = {describe(cycle) for cycle in cycles(import_graph())}
    new, gone = sorted(found - KNOWN_CYCLES), sorted(KNOWN_CYCLES - found)
    assert not new, "new import cycles:\n" + "\n".join(new)
    assert not gone, "these cycles are gone: take them out of KNOWN_CYCLES\n" + "\n".join(gone)
