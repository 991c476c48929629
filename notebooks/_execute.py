"""`make notebooks`: build every notebook from ``_build.py``, execute it, save it with its outputs.

    python notebooks/_execute.py                        # all of them
    python notebooks/_execute.py 03-sync-strategies.ipynb

Each runs top to bottom in a fresh kernel on a local 2-engine CPU cluster, so the code host and
nbviewer show its results without a kernel.  Each code cell records the hash of the source it
ran (``metadata.phalanx.source_sha256``); ``tests/test_notebooks_saved.py`` compares it with the
source ``_build.py`` gives now, so saved outputs cannot silently go stale.

What is saved is what renders without a kernel: live widgets, their saved state and JavaScript
libraries are dropped (the run summary each ``%%distributed_fit`` leaves behind is a static
table and PNG); execution timestamps are not recorded, so re-running gives small diffs.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _build  # noqa: E402  (the notebooks' source, next to this file)

# Output types that need a live kernel or a JavaScript library to show anything.
LIVE_ONLY = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json",
             "application/javascript", "application/vnd.bokehjs_load.v0+json",
             "application/vnd.bokehjs_exec.v0+json")
TIMEOUT_S = 900


def source_hash(source: str) -> str:
    """What a code cell's saved outputs are tied to.

    >>> source_hash("1 + 1")[:12]
    '72fce59447a0'
    """
    return hashlib.sha256(source.encode()).hexdigest()


def static_outputs(outputs: list) -> list:
    """``outputs`` without what needs a kernel or a script to render (and nothing left empty)."""
    kept = []
    for output in outputs:
        if output.get("output_type") in ("display_data", "execute_result"):
            if "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
                continue  # a live widget: its text fallback ("VBox(...)") says nothing
            for mime in LIVE_ONLY:
                output["data"].pop(mime, None)
            if not any(str(value).strip() for value in output["data"].values()):
                continue  # e.g. a script loader emptied once the page had it
        kept.append(output)
    return kept


def execute(name: str) -> nbformat.NotebookNode:
    """Notebook ``name`` built from its source and executed, with static outputs only."""
    nb = _build.build(name)
    NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(HERE)}}).execute()
    nb.metadata.pop("widgets", None)  # saved widget state: large, and useless without a kernel
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = static_outputs(cell.outputs)
            cell.metadata["phalanx"] = {"source_sha256": source_hash(cell.source)}
    return nb


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(_build.NOTEBOOKS))
    if unknown:
        print(f"no such notebook in notebooks/_build.py: {', '.join(unknown)}; "
              f"choose from {', '.join(_build.NOTEBOOKS)}", file=sys.stderr)
        return 2
    for name in names or list(_build.NOTEBOOKS):
        started = time.perf_counter()
        nb = execute(name)
        nbformat.write(nb, HERE / name)
        size = (HERE / name).stat().st_size
        print(f"{name}: executed in {time.perf_counter() - started:.0f} s, saved ({size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
