"""The examples the package and its manual show run, and show what they say.

* Every ``>>>`` example in the docstrings of the package's modules (and of ``docs/links.py``)
  runs as a doctest.  An example that needs a running cluster, kernel or notebook is written as a
  plain literal block instead (``Example::`` and indented code, no ``>>>``), which doctest leaves
  alone; the manual's pages and the notebooks run those.
* The getting-started page of the manual (``docs/getting-started.md``) says its cells are a
  whole session that runs as written: its ``ipython`` blocks run here, one cell each, in a real
  IPython shell on a real 2-engine cluster.
"""

from __future__ import annotations

import doctest
import importlib
import re
import sys
from pathlib import Path

import pytest
from conftest import assert_all_gone, engine_pids, run_cell

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kernel_ext" / "phalanx"
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"


def modules_with_examples() -> list[str]:
    """Dotted names of the package's modules whose source shows a ``>>>`` example (found
    without importing them, so collecting the tests stays cheap)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.parts or ">>>" not in path.read_text():
            continue
        parts = ("phalanx", *path.relative_to(PACKAGE).with_suffix("").parts)
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = modules_with_examples()


def run_examples(module) -> doctest.TestResults:
    return doctest.testmod(module, optionflags=doctest.ELLIPSIS)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    examples = [example for test in doctest.DocTestFinder().find(module) for example in test.examples]
    skipped = sum(bool(example.options.get(doctest.SKIP)) for example in examples)
    result = run_examples(module)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name} (above)"
    assert examples and result.attempted == len(examples) - skipped, \
        f"{name} shows '>>>' but doctest ran {result.attempted} of its {len(examples)} example(s)"


def test_the_links_helpers_examples():
    sys.path.insert(0, str(DOCS))
    try:
        import links
    finally:
        sys.path.remove(str(DOCS))
    result = run_examples(links)
    assert result.attempted > 0 and result.failed == 0


def test_every_package_with_examples_is_found():
    """The walk above sees the package's subpackages (a renamed folder would silently drop
    its examples from the test)."""
    found = {name.split(".")[1] for name in MODULES if name.count(".")}
    assert {"cluster", "fit", "network", "runtime", "widgets"} <= found


def page_cells(page: Path) -> list[str]:
    """The ``ipython`` code blocks of a MyST page, in order."""
    return re.findall(r"^```ipython\n(.*?)^```$", page.read_text(), re.M | re.S)


@pytest.mark.cluster
@pytest.mark.slow
def test_the_getting_started_page_runs_as_written(shell, no_cluster):
    cells = page_cells(GETTING_STARTED)
    assert len(cells) >= 6 and cells[0].startswith("%load_ext phalanx")
    session = no_cluster
    pids: list[int] = []
    for cell in cells:
        if cell.startswith("%cluster stop"):
            pids = engine_pids(session)
        run_cell(shell, cell)
        if cell.startswith("%%distributed_fit"):
            assert session.last_run().status == "done"
            assert session.last_run().world_size == 2
    assert shell.user_ns["accuracy"] > 0.9, "the page shows a model that trained"
    assert len(pids) == 3, "the page scales the cluster to 3 engines before stopping it"
    assert not session.running
    assert_all_gone(pids)
