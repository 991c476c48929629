"""The example notebooks are saved executed, from their current source, and render without a kernel.

``make notebooks`` builds each notebook from notebooks/_build.py, executes it and records in every
code cell the hash of the source it ran.  These checks read the saved files only (no kernel): a
notebook whose source changed since its outputs were made fails here, with the command to run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))

import _build  # noqa: E402
from _execute import LIVE_ONLY, source_hash  # noqa: E402

MAX_BYTES = 1_500_000  # a page of text and a few PNGs; a saved widget state or script is larger
REFRESH = "run `make notebooks` to rebuild and re-execute the notebooks"


def _saved(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def _outputs(nb: nbformat.NotebookNode) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


@pytest.mark.parametrize("name", list(_build.NOTEBOOKS))
def test_saved_cells_are_the_built_source(name):
    saved, built = _saved(name), _build.build(name)
    assert [(c.cell_type, c.source) for c in saved.cells] == \
        [(c.cell_type, c.source) for c in built.cells], f"{name} differs from _build.py: {REFRESH}"


@pytest.mark.parametrize("name", list(_build.NOTEBOOKS))
def test_every_code_cell_ran_from_its_current_source(name):
    for index, cell in enumerate(_saved(name).cells):
        if cell.cell_type != "code":
            continue
        recorded = cell.metadata.get("phalanx", {}).get("source_sha256")
        assert recorded == source_hash(cell.source), f"{name} cell {index}: outputs are stale; {REFRESH}"
        assert cell.execution_count is not None, f"{name} cell {index} was not executed; {REFRESH}"


@pytest.mark.parametrize("name", list(_build.NOTEBOOKS))
def test_saved_outputs_render_without_a_kernel(name):
    nb = _saved(name)
    nbformat.validate(nb)
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"], f"{name} saved an error"
    live = {mime for o in outputs for mime in o.get("data", {}) if mime in LIVE_ONLY}
    assert not live, f"{name} keeps {live}: they show nothing without a kernel"
    assert "widgets" not in nb.metadata, f"{name} keeps saved widget state"
    assert (NOTEBOOKS / name).stat().st_size < MAX_BYTES
    # What a reader comes for: a result drawn as a picture or a table, not only text.
    assert any({"image/png", "text/html", "image/svg+xml"} & set(o.get("data", {})) for o in outputs), name


@pytest.mark.parametrize("name", list(_build.NOTEBOOKS))
def test_nbviewer_rendering_keeps_every_picture(name):
    """nbviewer renders with nbconvert's HTML exporter: the saved pictures must come through."""
    from nbconvert import HTMLExporter

    nb = _saved(name)
    outputs = _outputs(nb)
    pictures = sum("image/png" in o.get("data", {}) for o in outputs)
    embedded = {kind: sum(str(o.get("data", {}).get("text/html", "")).count(f"data:image/{kind}")
                          for o in outputs) for kind in ("png", "svg+xml")}  # summaries' curves
    drawings = sum("<svg" in str(o.get("data", {}).get("text/html", "")) for o in outputs)
    html, _ = HTMLExporter().from_notebook_node(nb)
    assert html.count("data:image/png;base64") >= pictures + embedded["png"]
    assert html.count("data:image/svg+xml;base64") >= embedded["svg+xml"]
    assert html.count("<svg") >= drawings
