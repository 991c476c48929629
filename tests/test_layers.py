"""The package's layers, as a test: which of phalanx's packages may import which (the
cycles between modules are test_structure's).

The wire (the seam types, options, picklers, store protocol) is at the bottom: both sides stand
on it and it imports nothing else of phalanx.  The engine runtime is above it (engines import it
alone: it never reaches up to the kernel's side), its transport below the runtime's rooms, and
library adapters reached only through their registry; the cluster machinery knows nothing of
runs or views; the run's kernel side (fit) knows nothing of views and reaches the runtime only
through ``phalanx.runtime``'s names; views read telemetry through ``phalanx.fit.telemetry``.
A failure names the module, line and import that breaks a rule.  Imports inside functions
count: they are how a layer would reach up without a cycle showing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from test_structure import PACKAGE

# package (a dotted prefix of module names) -> prefixes of phalanx it must not import
_ABOVE_RUNTIME = ["phalanx.fit", "phalanx.cluster", "phalanx.widgets", "phalanx.network",
                  "phalanx.events", "phalanx._"]
# the runtime's rooms: the kernel's side reaches them only through ``phalanx.runtime``'s names
_RUNTIME_ROOMS = ["phalanx.runtime.run", "phalanx.runtime.sync", "phalanx.runtime.commits",
                  "phalanx.runtime.debug", "phalanx.runtime.telemetry",
                  "phalanx.runtime.adapters", "phalanx.runtime._"]
# adapters one module per library: the rest of the runtime reaches them through the registry
# (and torchrun's world, which a run is entered in rather than an adapter installed)
_ADAPTER_MODULES = ["phalanx.runtime.adapters.sklearn", "phalanx.runtime.adapters.xgboost",
                    "phalanx.runtime.adapters.lightgbm", "phalanx.runtime.adapters.framework_logs",
                    "phalanx.runtime.adapters.double_split", "phalanx.runtime.adapters._"]
FORBIDDEN = {
    "phalanx.wire": ["phalanx.runtime", "phalanx.cluster", "phalanx.learning"] + _ABOVE_RUNTIME,
    "phalanx.runtime.transport": ["phalanx.runtime.", "phalanx.fit"] + _ABOVE_RUNTIME,
    "phalanx.runtime.adapters": _ABOVE_RUNTIME,
    "phalanx.runtime": _ABOVE_RUNTIME + _ADAPTER_MODULES,
    "phalanx.cluster": ["phalanx.fit", "phalanx.widgets", "phalanx.network"] + _RUNTIME_ROOMS,
    "phalanx.fit": ["phalanx.widgets", "phalanx.network", "phalanx._magics"] + _RUNTIME_ROOMS,
    "phalanx.network": ["phalanx.fit", "phalanx.widgets", "phalanx.runtime"],
    # views read a run through fit's telemetry names, never its rooms' modules
    "phalanx.widgets": ["phalanx.fit.run", "phalanx.fit.analysis", "phalanx.fit.debug",
                        "phalanx.fit.exports", "phalanx.fit.telemetry._",
                        "phalanx.fit._"] + _RUNTIME_ROOMS,
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every phalanx module or name ``path`` imports, relative
    imports resolved."""
    name = module_name(path, root)
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            start = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(start + ([node.module] if node.module else []))
            found.extend((node.lineno, f"{target}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
    return [(line, t) for line, t in found if t.split(".")[0] == root.name]


def _rule_for(module: str) -> tuple[str, list[str]] | None:
    """The most specific package rule ``module`` falls under."""
    owners = [p for p in FORBIDDEN if module == p or module.startswith(p + ".")]
    return (max(owners, key=len), FORBIDDEN[max(owners, key=len)]) if owners else None


def _under(target: str, prefix: str) -> bool:
    """``target`` is ``prefix`` or inside it; a prefix ending in ``.`` or ``_`` is one of names."""
    if prefix.endswith((".", "_")):
        return target.startswith(prefix)
    return target == prefix or target.startswith(prefix + ".")


def broken_rules(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        module = module_name(path, root)
        rule = _rule_for(module)
        if rule is None:
            continue
        package, forbidden = rule
        for line, target in imports_of(path, root):
            if target.startswith(package + ".") or target == package:
                continue  # within its own package
            if any(_under(target, prefix) for prefix in forbidden):
                out.append(f"{path.relative_to(root.parent)}:{line} imports {target} "
                           f"({package} may not import it)")
    return out


def test_every_package_imports_only_the_layers_below_it():
    assert broken_rules(PACKAGE) == []


def test_the_check_names_an_import_that_reaches_up(tmp_path):
    root = tmp_path / "phalanx"
    for sub in ("runtime", "fit"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "runtime" / "_entry.py").write_text(
        "import os\n\ndef run():\n    from ..fit._options import FitOptions\n")
    (root / "fit" / "_run.py").write_text("from ..runtime import run_cell\n")
    assert broken_rules(root) == [
        "phalanx/runtime/_entry.py:4 imports phalanx.fit._options.FitOptions "
        "(phalanx.runtime may not import it)"]


def test_importing_phalanx_is_cheap_no_numpy_no_torch():
    """Engines and ``%load_ext`` import it: the cell's API and the kernel's parts load on use."""
    probe = ("import sys, phalanx\n"
             "heavy = sorted(m for m in ('numpy', 'torch', 'IPython', 'ipyparallel', 'zmq')"
             " if m in sys.modules)\n"
             "print(','.join(heavy), len([m for m in sys.modules if m.startswith('phalanx')]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert len(out) == 1, f"import phalanx loaded {out[0]}"
    # and a cell's API is still there on first use
    check = subprocess.run([sys.executable, "-c", "from phalanx import allreduce, wrap, steps, "
                            "barrier, broadcast, no_sync, SyncStrategy; print('ok')"],
                           capture_output=True, text=True, check=True).stdout
    assert check.strip() == "ok"
