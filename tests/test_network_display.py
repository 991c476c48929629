"""The notebook drawing: a pure layered layout and an SVG of node states."""

import re

import numpy as np
from phalanx.network import machine, network_event, node, source
from phalanx.network._drawing import STATE_COLOURS, layered_layout, render_svg
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler


def test_layout_columns_are_longest_paths_from_roots():
    edges = [("X", "stand"), ("stand", "pca"), ("pca", "ridge"), ("y", "ridge"),
             ("pca", "tree"), ("y", "tree"), ("ridge", "yhat"), ("tree", "yhat"),
             ("X", "yhat")]
    pos = layered_layout(["X", "y", "stand", "pca", "ridge", "tree", "yhat"], edges)
    assert {k: c for k, (c, _) in pos.items()} == {"X": 0, "y": 0, "stand": 1, "pca": 2,
                                                   "ridge": 3, "tree": 3, "yhat": 4}
    assert len(set(pos.values())) == len(pos)   # no two boxes in one cell


def test_layout_orders_a_column_by_its_predecessors_rows():
    # c's parent is in row 1 and d's in row 0: d goes above c, so the edges do not cross.
    pos = layered_layout(["a", "b", "c", "d"], [("b", "c"), ("a", "d")])
    assert pos == {"a": (0, 0), "b": (0, 1), "c": (1, 1), "d": (1, 0)}


def test_layout_handles_unknown_edges_and_empty_graphs():
    assert layered_layout([], []) == {}
    assert layered_layout(["a"], [("zz", "a")]) == {"a": (0, 0)}


def test_svg_shows_every_node_with_its_state_colour_and_every_edge():
    X, y = source(np.ones((5, 2)), name="X"), source(np.arange(5.0), name="y")
    stand = machine(StandardScaler(), X, name="stand")
    W = stand.transform(X)
    ridge = machine(Ridge(), W, y, name="ridge")
    out = node(np.negative, ridge.predict(W), name="neg")
    stand.fit()
    svg = render_svg(network_event(out))
    for label in ("X", "y", "stand", "ridge", "neg", "StandardScaler", "Ridge"):
        assert f">{label}" in svg
    assert svg.count("marker-end=") == 4   # X->stand, stand->ridge, y->ridge, ridge->neg
    fills = re.findall(r'<rect x="\d+" y="\d+" width="136" height="40" rx="\d+" fill="(#\w+)"',
                       svg)
    assert fills == [STATE_COLOURS[s] for s in
                     ("fitted", "fitted", "fitted", "fresh", "fresh")]
    assert svg.startswith("<svg") and svg.endswith("</svg>")


def test_nodes_and_machines_display_as_html_in_the_notebook():
    X, y = source(np.ones((5, 2)), name="X"), source(np.arange(5.0), name="y")
    ridge = machine(Ridge(), X, y, name="ridge")
    html = ridge.predict(X)._repr_html_()
    assert html.startswith('<div class="phalanx-network"><svg') and ">ridge<" in html
    assert ">ridge<" in ridge._repr_html_()


def test_labels_are_escaped():
    X = source(np.ones(3), name="<b>&")
    assert "&lt;b&gt;&amp;" in render_svg(network_event(X))


def test_the_dag_picture_scales_to_its_box():
    """A wide network fits a narrow notebook column: the picture has a viewBox of its own size
    and may shrink to the output's width (notebook 02's DAG was clipped without one)."""
    import xml.etree.ElementTree as ET

    X = source(np.ones((5, 2)), name="X")
    last = X
    for i in range(6):
        last = machine(StandardScaler(), last, name=f"step{i}").transform(last)
    root = ET.fromstring(render_svg(network_event(last)))
    width, height = float(root.get("width")), float(root.get("height"))
    assert root.get("viewBox") == f"0 0 {width:g} {height:g}" and width > 800
    assert "max-width:100%" in root.get("style") and "height:auto" in root.get("style")
