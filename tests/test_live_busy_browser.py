"""The live view in a real JupyterLab (headless Chromium) over many runs.

Run after run, the view under a ``%%distributed_fit`` cell builds a bokeh plot and the run's
summary replaces the view.  The page's BokehJS keeps every document it ever built
(``Bokeh.documents``) and jupyter_bokeh releases nothing when its view goes: 30 runs left 33
documents in the page.  Here ``RUNS`` runs in a row, each drawing its plot (counted as the
plots' root elements are added to the page), leave at most one document.
"""

from __future__ import annotations

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    StepClock,
    lab_page,
    lab_server,
    open_notebook,
    run_cell,
    screenshot,
    screenshot_on_failure,
    training_loop,
    write_notebook,
)
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

RUNS = 10
# Each body its own (a comment): a cell whose last run was short builds no plot ahead, and
# these runs must each draw one.  40 steps at 0.05 s: 2 s, enough for the plot to be drawn.
DOCS_CELLS = ["%load_ext phalanx\n%cluster start -n 2 --gpus none",
              *(f"%%distributed_fit --name docs-{i} --steps 40\n# run {i}\n" + training_loop(40)
                for i in range(RUNS)),
              "%cluster stop"]
CLUSTER_TIMEOUT_MS = 180_000
# Counts the plots drawn: the root element of each bokeh render added anywhere in the page.
COUNT_PLOTS = """() => {
    window.__plots = 0;
    new MutationObserver(records => {
        for (const r of records) for (const n of r.addedNodes) {
            if (n.nodeType !== 1) continue;
            window.__plots += (n.matches('[data-root-id]') ? 1 : 0)
                              + n.querySelectorAll('[data-root-id]').length;
        }
    }).observe(document.body, {childList: true, subtree: true});
}"""
DOCUMENTS = "() => window.Bokeh && window.Bokeh.documents ? window.Bokeh.documents.length : 0"


@pytest.mark.timeout(600)
def test_runs_in_a_row_leave_a_bounded_number_of_plot_documents(lab_server, lab_page):
    page, step = lab_page, StepClock()
    write_notebook(lab_server.root / "documents.ipynb", DOCS_CELLS)
    with screenshot_on_failure(page, "phalanx-live-documents-failure.png"):
        open_notebook(page, lab_server, "documents.ipynb")
        page.evaluate(COUNT_PLOTS)
        run_cell(page, 0, timeout_ms=hang_limit(CLUSTER_TIMEOUT_MS))
        step("cluster up")
        documents = []
        for i in range(RUNS):
            assert "docs-" in run_cell(page, 1 + i, timeout_ms=hang_limit(120_000))
            documents.append(page.evaluate(DOCUMENTS))
        step(f"{RUNS} runs")
        plots = page.evaluate("() => window.__plots")
        screenshot(page, "phalanx-live-documents.png")
        run_cell(page, 1 + RUNS)
    print(f"measured: {plots} plots drawn in {RUNS} runs; bokeh documents after each: {documents}")
    assert plots >= RUNS // 2, f"only {plots} of {RUNS} runs drew their plot: lengthen the runs"
    assert max(documents) <= 1, documents
