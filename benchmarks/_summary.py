"""Turn each benchmark's JSON into rows of the ratio table (one place knows every format)."""

from __future__ import annotations

import re
from typing import Callable

from _summary_rows import _row, teardown_note  # noqa: F401  (teardown_note: tests read it here)
from _summary_runs import (_boosting, _frameworks, _gpu_step, _latency, _sharded, _start,
                           _step_cost, _throughput)

# (section name, script) in the order they run and appear in the table.
SECTIONS = [
    ("latency", "bench_latency.py"),
    ("allreduce", "bench_allreduce.py"),
    ("throughput", "bench_throughput.py"),
    ("step_cost", "bench_step_cost.py"),
    ("metrics", "bench_metrics.py"),
    ("trackers", "bench_trackers.py"),
    ("history", "bench_history.py"),
    ("network", "bench_network.py"),
    ("cluster_start", "bench_start.py"),
    ("inside", "bench_inside.py"),
    ("guard", "bench_guard.py"),
    ("live", "bench_live.py"),
    ("first_line", "bench_first_line.py"),
    ("bokehjs", "bench_bokehjs.py"),
    ("live_browser", "bench_live_browser.py"),
    ("step_parts", "bench_step_parts.py"),
    ("frameworks", "bench_frameworks.py"),
    ("sharded", "bench_sharded.py"),
    ("boosting", "bench_boosting.py"),
    ("gpu", "bench_gpu.py"),  # records "skipped" where there is no CUDA device
    ("gpu_step", "bench_gpu_step.py"),  # likewise
]


def _generic(section: str) -> Callable[[dict], list[dict]]:
    """Sections that report their own rows as ``{"summary": [{name, value, target, met, detail}]}``."""
    def rows(d: dict) -> list[dict]:
        return [_row(section, r["name"], r.get("value"), r.get("target", ""), r.get("met"),
                     r.get("detail", "")) for r in d.get("summary", [])]
    return rows


def _size(nbytes: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _allreduce(d: dict) -> list[dict]:
    rows = []
    for size, r in sorted(d["ratios"].items(), key=lambda kv: int(kv[0])):
        label = _size(int(size))
        rows.append(_row("allreduce", f"{label}: latency vs gloo", r["shm_vs_gloo"], "<= 1x",
                         r["ok_vs_gloo"]))
        if "shm_vs_mpich" in r:
            target = r.get("target_vs_mpich", "<= 2") + "x"  # <= 1x up to 8 KB since issue 59
            lat = d.get("results", {}).get(size, {})
            detail = (f"{_us(max(lat['shm-torch']['median_s'], lat['shm-numpy']['median_s']))} vs "
                      f"{_us(lat['mpich']['median_s'])}" if int(size) <= 8 << 10 and lat else "")
            rows.append(_row("allreduce", f"{label}: latency vs MPICH", r["shm_vs_mpich"], target,
                             r["ok_vs_mpich"], detail))
        if "busbw_vs_mpich" in r:
            rows.append(_row("allreduce", f"{label}: bus bandwidth vs MPICH", r["busbw_vs_mpich"],
                             ">= 1x", r["ok_busbw"]))
    idle = d.get("idle_wait_cpu")
    if idle:  # issue 59: a rank waiting for a peer between steps burns no core
        load = d.get("machine", {})
        rows.append(_row("allreduce", "a rank waiting 1 s in a collective: share of a core",
                         idle["shm"], "<= 0.05", idle["shm"] <= 0.05,
                         f"MPICH {idle['mpich']:.2f}; load during the section "
                         f"{load.get('loadavg_start', 0):.1f}->{load.get('loadavg_end', 0):.1f}"))
    return rows


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def _network(d: dict) -> list[dict]:
    r, targets = d["ratios"], d.get("targets", {})
    rows = []
    for key, label in (("leaf_refit_vs_leaf_own_fit", "refit after one leaf change vs that leaf's fit"),
                       ("leaf_refit_vs_leaf_own_fit_cpu", "same, CPU time"),
                       ("leaf_refit_vs_network_full_refit", "refit after one leaf change vs full refit"),
                       ("leaf_refit_vs_sklearn_pipeline_refit", "refit after one leaf change vs scikit-learn refit"),
                       ("cluster_vs_serial_two_branches", "two equal branches on 2 engines vs serial")):
        if key in r:
            target = targets.get(key)
            rows.append(_row("network", label, r[key], f"<= {target}x" if target else "reported",
                             r[key] <= target if target else None))
    return rows


def _metrics(d: dict) -> list[dict]:
    t, lat = d["throughput"], d["latency_under_load"]
    return [
        _row("metrics", "training with live view vs --no-widget at >= 1,000 log()/s per rank",
             t["ratio_of_medians"], ">= 0.99x", t["ratio_of_medians"] >= 0.99,
             f"bound from kernel CPU use {t['ratio_bound_from_cpu']:.3f}; rows lost {t['rows_lost']}"),
        _row("metrics", "engine log() to kernel history, p95 (ms)", lat["history_p95_ms"], "< 250 ms",
             lat["history_p95_ms"] < 250, f"p50 {lat['history_p50_ms']:.0f} ms"),
    ] + [
        _row("metrics", f"same at {paced['rows_per_s']:,} rows/s (8 ranks x 1,000 log()/s), p95 (ms)",
             paced["history_p95_ms"], "< 250 ms", paced["history_p95_ms"] < 250,
             f"p50 {paced['history_p50_ms']:.0f} ms; to the live view p95 {paced['view_p95_ms']:.0f} ms")
        for paced in [d["latency_paced"]] if "latency_paced" in d
    ]


def _cpu_rate(rate: dict) -> str:
    cpu = rate.get("cpu_rows_per_s")
    return f"; {cpu['median'] / 1e6:.2f} M rows per CPU-second" if cpu else ""


def _history(d: dict) -> list[dict]:
    rows = []
    for size in ("50", "2500"):
        rate = d["append_rows_per_s"][size]["median"]
        rows.append(_row("history", f"append, batches of {size} rows: M rows/s", rate / 1e6, ">= 1",
                         rate >= 1e6, f"{d[f'ratio_append_vs_dicts_{size}']:.2f}x the dict-per-row history"
                         + _cpu_rate(d["append_rows_per_s"][size])))
    rows.append(_row("history", "bytes per row in memory (2 metrics)", d["bytes_per_row"], "reported",
                     None, f"dict-per-row history: {d['baseline_bytes_per_row']:.0f}"))
    long = d["long"]
    rows.append(_row("history", f"{long['rows'] / 1e6:.0f}M rows: kernel RSS growth (MB)",
                     long["rss_growth_mb"], "<= 400", long["rss_growth_mb"] <= 400,
                     f"fed through the receiving path in {long['feed_s']:.0f} s"))
    window = long["window_to_pandas_s"]["median"]
    rows.append(_row("history", "one rank's 100k-step window, to_pandas (s)", window, "< 1 s",
                     window < 1, f"all of one rank's rows: {long['one_rank_columns_s']:.2f} s"))
    stream = d.get("stream") or {}
    if stream:
        # The bound holds when ten times the logging rate brings the panel about as many rows.
        low, high = stream["1000"]["thinned"], stream["10000"]["thinned"]
        growth = high["panel_rows_per_rank_per_s"] / low["panel_rows_per_rank_per_s"]
        for rate, both in stream.items():
            rows.append(_row("history", f"panel stream at 8 ranks x {int(rate):,} log()/s: bytes vs every row",
                             both["ratio_bytes"], "reported", None,
                             f"{both['thinned']['panel_rows_per_rank_per_s']:.0f} rows per rank and second "
                             "reach the panel"))
        rows.append(_row("history", "panel rows per rank and second, 10x the logging rate", growth,
                         "< 1.5x", growth < 1.5, f"{low['panel_rows_per_rank_per_s']:.0f} -> "
                         f"{high['panel_rows_per_rank_per_s']:.0f}"))
    return rows


_SUMMARIZERS = {"history": _history, "metrics": _metrics, "latency": _latency, "throughput": _throughput, "cluster_start": _start,
                "allreduce": _allreduce, "network": _network, "frameworks": _frameworks,
                "sharded": _sharded, "boosting": _boosting, "step_cost": _step_cost,
                "gpu_step": _gpu_step}


def summarize(sections: dict[str, dict]) -> list[dict]:
    rows: list[dict] = []
    for name, _ in SECTIONS:
        data = sections.get(name)
        if data is None:
            continue
        if "error" in data:
            rows.append(_row(name, "(benchmark failed)", None, "", False, data["error"].splitlines()[-1:][0] if data["error"] else ""))
            continue
        rows.extend(_SUMMARIZERS.get(name, _generic(name))(data))
    return rows


def _shown(value: float, row: dict) -> str:
    """Three significant digits; four where three would round a missed target onto it
    (0.9696 against ">= 0.97x" would read "0.97 ... no")."""
    short = f"{value:.3g}"
    bound = re.search(r"[\d.]+", row["target"] or "")
    if row["met"] is False and bound and float(short) == float(bound.group()):
        return f"{value:.4g}"
    return short


def render_markdown(machine: dict, rows: list[dict]) -> str:
    head = (f"Measured on `{machine.get('kind')}`: {machine.get('cpu', '?')}, {machine.get('cores')} cores, "
            f"{machine.get('memory_gib', '?')} GiB, torch {machine.get('torch', '?')}"
            + (f", {machine['gpu']}" if machine.get("gpu") else "") + ". Medians of at least 5 runs.\n\n")
    lines = ["| section | measure | ratio | target | met | detail |", "|---|---|---|---|---|---|"]
    for r in rows:
        value = "" if r["value"] is None else _shown(r["value"], r)
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        lines.append(f"| {r['section']} | {r['name']} | {value} | {r['target']} | {met} | {r['detail']} |")
    return head + "\n".join(lines)
