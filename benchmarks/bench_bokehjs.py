"""BokehJS before the first chart (issue 56): what the page receives and evaluates once per kernel
before a live view can draw, phalanx's loader against bokeh's default one, in headless Chromium.

phalanx sends only the bundles the live view's models need (``widgets/_bokehjs.COMPONENTS``);
bokeh's default inline loader adds MathJax, tables and WebGL.  Each loader is added to a fresh
page and timed until ``window.Bokeh`` (with its widgets) is ready, alternating the two.  Target:
below 1x in time and in bytes.

    python benchmarks/bench_bokehjs.py [--json OUT] [--quick]
"""

from __future__ import annotations

import statistics
import time

from _common import parse_args, save, stats

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
READY = "() => window.Bokeh !== undefined && window.Bokeh.Widgets !== undefined"


def loaders() -> dict[str, str]:
    """The JavaScript each loader publishes (its ``application/javascript`` output)."""
    from bokeh.io import notebook
    from bokeh.io.notebook import load_notebook
    from bokeh.resources import INLINE
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from phalanx.widgets._bokehjs import load_bokehjs

    shell = InteractiveShell.instance()
    with capture_output(stdout=False, stderr=False) as ours:
        load_bokehjs(shell)
    notebook._NOTEBOOK_LOADED = None  # bokeh publishes its loader once per process otherwise
    with capture_output(stdout=False, stderr=False) as default:
        load_notebook(resources=INLINE, hide_banner=True)
    return {name: captured.outputs[0].data["application/javascript"]
            for name, captured in (("phalanx", ours), ("bokeh_default", default))}


def load_times(scripts: dict[str, str], repeats: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {name: [] for name in scripts}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            for _ in range(repeats):
                for name, script in scripts.items():  # alternated: a slow moment hits both
                    page = browser.new_page()
                    page.set_content("<html><body></body></html>")
                    started = time.perf_counter()
                    page.add_script_tag(content=script)
                    page.wait_for_function(READY, timeout=120_000)
                    times[name].append(time.perf_counter() - started)
                    page.close()
        finally:
            browser.close()
    return times


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    scripts = loaders()
    times = load_times(scripts, 3 if args.quick else 7)
    ours, default = (statistics.median(times[k]) for k in ("phalanx", "bokeh_default"))
    size_ratio = len(scripts["phalanx"]) / len(scripts["bokeh_default"])
    summary = [
        {"name": "BokehJS loaded and evaluated before the first chart: phalanx's loader vs "
                 "bokeh's default", "value": ours / default, "target": "< 1x",
         "met": ours < default, "detail": f"{ours * 1e3:.0f} ms vs {default * 1e3:.0f} ms"},
        {"name": "BokehJS sent to the page: phalanx's loader vs bokeh's default (bytes)",
         "value": size_ratio, "target": "< 1x", "met": size_ratio < 1,
         "detail": f"{len(scripts['phalanx']) / 1e6:.2f} MB vs "
                   f"{len(scripts['bokeh_default']) / 1e6:.2f} MB, each of its two outputs"},
    ]
    for row in summary:
        print(f"{row['name']}: {row['value']:.3f}x ({row['detail']})")
    data = {"seconds": {k: stats(v) for k, v in times.items()},
            "bytes": {k: len(v) for k, v in scripts.items()}, "summary": summary}
    save("bokehjs", data, args.json)
    return data


if __name__ == "__main__":
    main()
