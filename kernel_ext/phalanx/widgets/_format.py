"""Text for the views: durations, rates, per-rank progress and the one-line text progress (pure).

Every view (widget rows, the text fallback, the summary) formats through here so they agree.

Example::

    >>> fmt_duration(125)
    '2 min 05 s'
    >>> rank_text({"rank": 0, "step": 50, "total": 200, "steps_per_s": 25.0, "eta_s": 6.0,
    ...            "metrics": {"loss": 0.1234}, "straggler": False})
    '50/200 steps · 25.0 steps/s · ETA 6 s · loss 0.1234'
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..fit.telemetry import fmt_duration, fmt_wall  # noqa: F401  (the views' one place)

DOT = " · "
MAX_METRICS = 4  # more than a few numbers on one line stops being readable
# bokeh's and matplotlib's Category10: the live plot and the saved summary colour ranks alike.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def rank_colour(rank: int) -> str:
    """A stable colour per rank (Category10, cycled).

    Example::

        >>> rank_colour(0), rank_colour(10) == rank_colour(0)
        ('#1f77b4', True)
    """
    return PALETTE[rank % len(PALETTE)]


def fmt_number(value: Any) -> str:
    """A metric value in 4 significant digits.

    Example::

        >>> fmt_number(0.000123456), fmt_number(3)
        ('0.0001235', '3')
    """
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def fmt_metrics(metrics: Mapping[str, Any], limit: int = MAX_METRICS) -> str:
    """``loss 0.12 · acc 0.9`` for the first ``limit`` metrics.

    Example::

        >>> fmt_metrics({"loss": 0.5, "acc": 0.75})
        'loss 0.5 · acc 0.75'
    """
    items = list(metrics.items())
    text = DOT.join(f"{name} {fmt_number(value)}" for name, value in items[:limit])
    return text + (f"{DOT}+{len(items) - limit} more" if len(items) > limit else "")


def fmt_mb(mb: float | None) -> str:
    """``512 MB`` or ``1.50 GB`` (binary units, as the engines report them); ``–`` when unknown.

    Example::

        >>> fmt_mb(512.0), fmt_mb(1536.0), fmt_mb(None)
        ('512 MB', '1.50 GB', '–')
    """
    if mb is None:
        return "–"
    return f"{mb / 1024:.2f} GB" if mb >= 1024 else f"{mb:.0f} MB"


def memory_text(sample: Mapping[str, Any] | None) -> str:
    """One rank's memory: ``RSS 512 MB · GPU 1.20 GB / 2.00 GB (peak 1.50 GB)``.

    Example::

        >>> memory_text({"rss_mb": 512.0})
        'RSS 512 MB'
        >>> memory_text({"rss_mb": 512.0, "cuda_allocated_mb": 1228.8, "cuda_reserved_mb": 2048.0,
        ...              "cuda_peak_mb": 1536.0})
        'RSS 512 MB · GPU 1.20 GB / 2.00 GB reserved (peak 1.50 GB)'
    """
    if not sample:
        return ""
    parts = [f"RSS {fmt_mb(sample.get('rss_mb'))}"] if sample.get("rss_mb") is not None else []
    if sample.get("cuda_allocated_mb") is not None:
        parts.append(f"GPU {fmt_mb(sample['cuda_allocated_mb'])} / "
                     f"{fmt_mb(sample.get('cuda_reserved_mb'))} reserved"
                     + (f" (peak {fmt_mb(sample['cuda_peak_mb'])})"
                        if sample.get("cuda_peak_mb") is not None else ""))
    return DOT.join(parts)


def time_text(part: Mapping[str, Any] | None) -> str:
    """One rank's time in collectives: ``collectives 1.2 s, 75% waiting for a peer``.

    Example::

        >>> time_text({"collective_s": 1.2, "collective_wait_s": 0.9, "collectives": 4})
        'collectives 1.2 s, 75% waiting for a peer'
        >>> time_text({"collective_s": 0.0, "collective_wait_s": 0.0, "collectives": 0})
        ''
    """
    if not part or not part.get("collectives"):
        return ""
    total = part["collective_s"]
    share = part["collective_wait_s"] / total if total > 0 else 0.0
    return f"collectives {total:.2g} s, {share:.0%} waiting for a peer"


def fmt_rate(rate: float | None) -> str:
    """``12.3 steps/s``; ``–`` before a rate is known."""
    return "– steps/s" if rate is None else f"{rate:.1f} steps/s"


def known_total(p: Mapping[str, Any]) -> int | None:
    """The rank's total steps if it is one: none given, or the rank went past it (``--steps``
    is a hint; a loop that takes more steps proves it wrong), ``None``.

    Example::

        >>> known_total({"step": 50, "total": 200}), known_total({"step": 260, "total": 240})
        (200, None)
    """
    total = p.get("total")
    return int(total) if total and int(p["step"]) <= int(total) else None


def rank_text(p: Mapping[str, Any]) -> str:
    """The one line of one rank's progress (a ``progress`` event entry): the steps (of the
    total while it holds), the rate, the ETA while there is one, the latest metrics.

    Example::

        >>> rank_text({"rank": 0, "step": 260, "total": 240, "steps_per_s": 25.0, "eta_s": 0.0})
        '260 steps · 25.0 steps/s'
    """
    total = known_total(p)
    parts = [f"{p['step']}/{total} steps" if total else f"{p['step']} steps", fmt_rate(p.get("steps_per_s"))]
    if total and p["step"] < total and p.get("eta_s") is not None:
        parts.append(f"ETA {fmt_duration(p.get('eta_s'))}")
    metrics = fmt_metrics(p.get("metrics") or {})
    if metrics:
        parts.append(metrics)
    if p.get("straggler"):
        parts.append("straggler")
    return DOT.join(parts)


def bar_range(ranks: Iterable[Mapping[str, Any]]) -> int | None:
    """The progress bars' maximum: the total steps while it holds, else ``None``.

    Without a total there is nothing to fill a bar towards: the leading rank's bar filled to
    the end looked finished from the first second, so the bars wait for the run's end.

    Example::

        >>> bar_range([{"step": 30, "total": 100}]), bar_range([{"step": 40, "total": None}])
        (100, None)
        >>> bar_range([{"step": 260, "total": 240}]) is None    # past it: the total is wrong
        True
    """
    ranks = list(ranks)
    if not ranks or any(known_total(r) is None for r in ranks):
        return None
    return max(int(r["total"]) for r in ranks)


def total_note(total: int | None, steps: Mapping[int, int], status: str) -> str:
    """What a finished run says when its total was wrong: ``--steps 240 did not match the 260
    steps counted`` (a run that ended early is not a wrong total); else ``""``.

    Example::

        >>> total_note(240, {0: 260, 1: 260}, "done")
        '--steps 240 did not match the 260 steps counted'
        >>> total_note(240, {0: 100}, "interrupted"), total_note(240, {0: 240}, "done")
        ('', '')
    """
    counted = max(steps.values(), default=0)
    if not total or counted == total or (counted < total and status != "done"):
        return ""
    return f"--steps {total} did not match the {counted} steps counted"


def overall(ranks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Run-wide figures: slowest rank's step, total (while it holds), mean rate, worst ETA,
    stragglers.

    Example::

        >>> overall([{"rank": 0, "step": 10, "total": 20, "steps_per_s": 2.0, "eta_s": 5.0},
        ...          {"rank": 1, "step": 8, "total": 20, "steps_per_s": 1.0, "eta_s": 12.0,
        ...           "straggler": True}])["eta_s"]
        12.0
    """
    rates = [r["steps_per_s"] for r in ranks if r.get("steps_per_s") is not None]
    total = bar_range(ranks)
    etas = [r["eta_s"] for r in ranks if r.get("eta_s") is not None] if total else []
    return {"step": min((int(r["step"]) for r in ranks), default=0),
            "total": total,
            "steps_per_s": sum(rates) / len(rates) if rates else None,
            "eta_s": max(etas) if etas else None,
            "stragglers": [r["rank"] for r in ranks if r.get("straggler")]}


def progress_line(name: str, ranks: Sequence[Mapping[str, Any]], elapsed_s: float,
                  status: str = "running") -> str:
    """The single line of the text progress (``--no-widget`` and terminals).

    Example::

        >>> progress_line("run-1", [{"rank": 0, "step": 5, "total": 10, "steps_per_s": 1.0,
        ...                          "eta_s": 5.0, "metrics": {"loss": 0.25}}], 5.0)
        'run-1 running 5 s · 1 rank(s) · 5/10 steps · 1.0 steps/s · ETA 5 s · rank 0: loss 0.25'
    """
    o = overall(ranks)
    parts = [f"{name} {status} {fmt_duration(elapsed_s)}", f"{len(ranks)} rank(s)",
             f"{o['step']}/{o['total']} steps" if o["total"] else f"{o['step']} steps",
             fmt_rate(o["steps_per_s"])]
    if o["total"] and status == "running" and o["eta_s"] is not None:
        parts.append(f"ETA {fmt_duration(o['eta_s'])}")
    if ranks and ranks[0].get("metrics"):
        parts.append(f"rank {ranks[0]['rank']}: {fmt_metrics(ranks[0]['metrics'], 2)}")
    if o["stragglers"]:
        parts.append("straggler(s): " + ", ".join(map(str, o["stragglers"])))
    return DOT.join(parts)
