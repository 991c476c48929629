"""The summary's SVG curves (pure): what a reader of a saved notebook sees of a run's metrics.

Each picture is parsed as XML, as a browser would: a panel per metric, a line per rank in its
colour and the dashed mean, the points where the data puts them, log scale where losses span
decades, single points as dots, gaps at non-finite values, and a size that does not grow with
the run's length.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np

from phalanx.widgets._format import rank_colour
from phalanx.widgets._series import MEAN
from phalanx.widgets._svg_curves import (LEFT, PLOT_H, PLOT_W, TOP, curves_svg, nice_ticks,
                                         wants_log_scale)

NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def panels(root: ET.Element) -> list[ET.Element]:
    return root.findall(f"{NS}g")


def texts(element: ET.Element) -> list[str]:
    return [t.text or "" for t in element.iter(f"{NS}text")]


def polyline_points(line: ET.Element) -> np.ndarray:
    return np.array([[float(v) for v in pair.split(",")] for pair in line.get("points").split()])


def two_ranks(steps: int = 50) -> dict:
    xs = np.arange(1, steps + 1, dtype=float)
    return {"loss": {0: (xs, 2.0 / xs), 1: (xs, 0.5 / xs), MEAN: (xs, 1.25 / xs)},
            "accuracy": {0: (xs, 1 - 1 / xs), 1: (xs, 1 - 0.5 / xs), MEAN: (xs, 1 - 0.75 / xs)}}


def test_nothing_logged_draws_nothing():
    assert curves_svg({}, world_size=2) is None


def test_a_panel_per_metric_a_line_per_rank_and_the_dashed_mean():
    root = parse(curves_svg(two_ranks(), world_size=2))
    assert int(root.get("width")) == 2 * 420 and int(root.get("height")) == 300
    loss, accuracy = panels(root)
    assert "loss (log scale)" in texts(loss) and "accuracy" in texts(accuracy)
    for panel in (loss, accuracy):
        lines = panel.findall(f"{NS}polyline")
        assert [line.get("stroke") for line in lines] == [rank_colour(0), rank_colour(1), "black"]
        assert lines[-1].get("stroke-dasharray") and all(len(polyline_points(x)) == 50 for x in lines)
        assert {"rank 0", "rank 1", "mean", "step"} <= set(texts(panel))


def test_points_land_where_the_data_puts_them():
    xs = np.array([0.0, 10.0])
    root = parse(curves_svg({"lr": {0: (xs, np.array([1.0, 3.0]))}}, world_size=1))
    (line,) = panels(root)[0].findall(f"{NS}polyline")
    (x0, y0), (x1, y1) = polyline_points(line)
    # inside the plot area, left to right, the larger value higher up
    assert LEFT <= x0 < x1 <= LEFT + PLOT_W and TOP <= y1 < y0 <= TOP + PLOT_H
    # the y tick labelled 2 sits halfway between the two points
    ticks = {t.text: float(t.get("y")) - 4 for t in panels(root)[0].iter(f"{NS}text")
             if t.get("text-anchor") == "end"}
    assert math.isclose(ticks["2"], (y0 + y1) / 2, abs_tol=0.2)


def test_log_scale_for_values_spanning_decades_with_a_tick_per_decade():
    xs = np.arange(1.0, 5.0)
    root = parse(curves_svg({"loss": {0: (xs, np.array([10.0, 1.0, 0.1, 0.01]))}}, world_size=1))
    (panel,) = panels(root)
    assert "loss (log scale)" in texts(panel)
    assert {"10", "1", "0.1", "0.01"} <= set(texts(panel))
    heights = polyline_points(panel.find(f"{NS}polyline"))[:, 1]
    assert np.allclose(np.diff(heights), np.diff(heights)[0])  # equal steps per decade
    assert wants_log_scale([5.0, 0.01]) and not wants_log_scale([0.0, 1.0])
    assert not wants_log_scale([float("nan"), 1.0, 2.0])


def test_single_points_are_dots_and_non_finite_values_break_the_line():
    one = {"loss": {0: (np.array([1.0]), np.array([0.5])), 1: (np.array([1.0]), np.array([0.7]))}}
    panel = panels(parse(curves_svg(one, world_size=2)))[0]
    assert len(panel.findall(f"{NS}circle")) == 2 and not panel.findall(f"{NS}polyline")
    ys = np.array([1.0, 2.0, np.nan, 3.0, 4.0, np.inf, 5.0])
    broken = {"loss": {0: (np.arange(7.0), ys)}}
    panel = panels(parse(curves_svg(broken, world_size=1)))[0]
    assert [len(polyline_points(x)) for x in panel.findall(f"{NS}polyline")] == [2, 2]
    assert len(panel.findall(f"{NS}circle")) == 1  # the lone 5.0 after the inf
    nothing = {"loss": {0: (np.arange(2.0), np.array([np.nan, np.nan]))}}
    assert "no finite values" in texts(panels(parse(curves_svg(nothing, world_size=1)))[0])


def test_a_long_run_stays_small_and_keeps_its_spike():
    n = 1_000_000
    xs = np.arange(n, dtype=float)
    ys = np.full(n, 1.0)
    ys[654_321] = 9.0
    svg = curves_svg({"loss": {0: (xs, ys)}}, world_size=1)
    assert len(svg) < 120_000
    panel = parse(svg).find(f"{NS}g")
    line = polyline_points(panel.find(f"{NS}polyline"))
    band = polyline_points(panel.find(f"{NS}polygon"))  # the range of each few pixel columns
    assert len(line) <= PLOT_W and band[:, 1].min() <= TOP + PLOT_H * 0.05  # the spike's top


def test_a_noisy_long_curve_reads_as_a_trend_inside_its_band():
    """1,300 noisy steps (the saved picture that was a black mass): one point per few pixels
    on the line, the spread as a light band, the mean solid."""
    rng = np.random.default_rng(0)
    xs = np.arange(1300.0)
    noisy = {r: (xs, 1 / (1 + xs / 100) + rng.normal(0, 0.15, xs.size)) for r in (0, 1)}
    svg = curves_svg({"loss": {**noisy, MEAN: (xs, (noisy[0][1] + noisy[1][1]) / 2)}}, world_size=2)
    panel = parse(svg).find(f"{NS}g")
    lines = panel.findall(f"{NS}polyline")
    assert [len(polyline_points(line)) <= PLOT_W / 2 for line in lines] == [True] * 3
    assert len(panel.findall(f"{NS}polygon")) == 2, "a band per rank, none for the mean"
    assert "stroke-dasharray" not in lines[-1].attrib and lines[-1].get("stroke") == "black"
    trend = polyline_points(lines[0])[:, 1]
    assert trend[-10:].mean() > trend[:10].mean(), "the loss falls (pixel y grows downwards)"


def test_many_ranks_keep_only_the_mean_in_the_legend_and_at_most_six_panels():
    xs = np.arange(5.0)
    lines = {r: (xs, xs + r) for r in range(12)} | {MEAN: (xs, xs + 5.5)}
    root = parse(curves_svg({f"m{i}": lines for i in range(8)}, world_size=12))
    assert len(panels(root)) == 6 and int(root.get("height")) == 600
    legend = texts(panels(root)[0])
    assert "mean" in legend and not any(t.startswith("rank ") for t in legend)


def test_values_at_the_float_limits_draw_without_nan_or_error():
    cases = ([-1e308, 1e308], [1e-300, 1e300], [5e-324, 1.0], [1.0, 1.0 + 1e-15], [0.0, 0.0])
    for ys in cases:
        svg = curves_svg({"m": {0: (np.arange(2.0), np.array(ys))}}, world_size=1)
        assert "nan" not in svg and "inf" not in svg, ys
        panel = panels(parse(svg))[0]
        assert len(polyline_points(panel.find(f"{NS}polyline"))) == 2, ys
        y_ticks = [t for t in panel.iter(f"{NS}text") if t.get("text-anchor") == "end"]
        assert 2 <= len(y_ticks) <= 9, (ys, texts(panel))  # a log axis over 600 decades too


def test_metric_names_are_escaped():
    root = parse(curves_svg({"<b>&loss": {0: (np.arange(2.0), np.arange(2.0))}}, world_size=1))
    assert "<b>&loss" in texts(panels(root)[0])


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(-3.0, 47.0) == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert nice_ticks(0.013, 0.0171) == [0.013, 0.014, 0.015, 0.016, 0.017]
