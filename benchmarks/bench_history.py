"""The kernel's metric history at scale: append throughput, memory per row, window reads.

1. Append throughput of ``MetricHistory.extend`` (the receiver thread's work per batch) in rows/s,
   8 ranks x 2 metrics, in batches of 50 rows (what a rank logging 1,000 times a second sends
   every 50 ms) and of 2,500 rows, by the wall clock and per CPU-second of the process.
   Baseline: the earlier storage, one dict per row appended to a list, measured in the same run.
   Target: >= 1M rows/s.
2. Memory per row in the kernel: RSS growth over the rows held in memory (the history keeps every
   row in memory here, to measure the row format), against the dict-per-row baseline.
3. A long history (10M rows; 2M with ``--quick``) fed through the run tracker's receiving path:
   RSS growth, then ``to_pandas`` of one rank's 100k-step window read back from disk (target
   < 1 s) and a full pass over one rank's rows.

    python benchmarks/bench_history.py --json OUT.json [--quick]
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time

import psutil

from _common import parse_args, save, stats

RANKS = 8
METRICS = {r: [{"loss": k * 0.001 + r, "acc": 0.5} for k in range(997)] for r in range(RANKS)}


def batch(rank: int, start: int, size: int) -> list:
    metrics = METRICS[rank]
    return [[s, 1e9 + s * 0.05, metrics[s % 997]] for s in range(start, start + size)]


class DictRows:
    """The earlier history: one dict per row (the anchor)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def extend(self, rank: int, rows: list) -> int:
        self.rows.extend({"rank": rank, "step": int(s), "t": float(t), **m} for s, t, m in rows)
        return len(rows)


def append_rate(make, rows_total: int, size: int, repeats: int) -> dict:
    """Rows/s of ``extend`` alone (input batches are built before the clock starts), by the wall
    clock and per second of this process's CPU time (``cpu_rows_per_s``: what one core does
    with the rows, less sensitive to other jobs sharing the machine)."""
    per_rank = rows_total // RANKS
    batches = [(r, batch(r, s, size)) for s in range(0, per_rank, size) for r in range(RANKS)]
    samples, cpu = [], []
    for _ in range(repeats):
        target = make()
        gc.collect()
        started, cpu_started = time.perf_counter(), time.process_time()
        for rank, rows in batches:
            target.extend(rank, rows)
        getattr(target, "columns", lambda: None)()   # rows still staged count too
        rows = len(batches) * size
        samples.append(rows / (time.perf_counter() - started))
        cpu.append(rows / max(1e-9, time.process_time() - cpu_started))
        del target
    return {**stats(samples), "cpu_rows_per_s": stats(cpu)}


def memory_per_row(make, rows_total: int) -> float:
    process = psutil.Process()
    gc.collect()
    before = process.memory_info().rss
    target = make()
    for start in range(0, rows_total // RANKS, 2500):
        for rank in range(RANKS):
            target.extend(rank, batch(rank, start, 2500))
    gc.collect()
    grown = process.memory_info().rss - before
    del target
    return grown / rows_total


def long_history(rows_total: int) -> dict:
    from phalanx.fit._tracker import RunTracker

    directory = tempfile.mkdtemp(prefix="phalanx-bench-history-")
    try:
        process = psutil.Process()
        before = process.memory_info().rss
        tracker = RunTracker("bench-1", RANKS, None, lambda event: None, history_dir=directory)
        started = time.perf_counter()
        peak = 0
        per_rank = rows_total // RANKS
        for start in range(0, per_rank, 2500):
            for rank in range(RANKS):
                tracker.on_batch({"rank": rank, "step": start + 2499, "rows": batch(rank, start, 2500)})
            peak = max(peak, process.memory_info().rss - before)
        fed = time.perf_counter() - started
        history = tracker.history
        mid = per_rank // 2
        window = [_time(lambda: history.to_pandas(rank=3, steps=(mid, mid + 100_000))) for _ in range(5)]
        whole_rank = _time(lambda: history.columns(rank=5))
        return {"rows": len(history), "feed_s": fed, "rss_growth_mb": peak / 1e6,
                "window_to_pandas_s": stats(window), "one_rank_columns_s": whole_rank}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _time(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    from phalanx.fit._history import MetricHistory

    repeats = 3 if args.quick else 5
    total = 400_000 if args.quick else 2_000_000
    held = lambda: MetricHistory(memory_rows=10**9)  # noqa: E731 - every row in memory
    data: dict = {"append_rows_per_s": {}, "baseline_rows_per_s": {}}
    for size in (50, 2500):
        data["append_rows_per_s"][str(size)] = append_rate(held, total, size, repeats)
        data["baseline_rows_per_s"][str(size)] = append_rate(DictRows, total, size, repeats)
    data["bytes_per_row"] = memory_per_row(held, total)
    data["baseline_bytes_per_row"] = memory_per_row(DictRows, total)
    data["long"] = long_history(2_000_000 if args.quick else 10_000_000)
    for size in ("50", "2500"):
        mine, base = data["append_rows_per_s"][size]["median"], data["baseline_rows_per_s"][size]["median"]
        data[f"ratio_append_vs_dicts_{size}"] = mine / base
        cpu = data["append_rows_per_s"][size]["cpu_rows_per_s"]["median"]
        print(f"append, batches of {size:>4}: {mine / 1e6:.2f} M rows/s, {cpu / 1e6:.2f} M per CPU-second "
              f"(dict rows {base / 1e6:.2f} M)")
    print(f"memory: {data['bytes_per_row']:.1f} bytes/row (dict rows {data['baseline_bytes_per_row']:.0f})")
    long = data["long"]
    print(f"{long['rows'] / 1e6:.0f}M rows: RSS +{long['rss_growth_mb']:.0f} MB, fed in {long['feed_s']:.1f} s, "
          f"one rank's window to_pandas {long['window_to_pandas_s']['median'] * 1e3:.0f} ms, "
          f"one rank's columns {long['one_rank_columns_s'] * 1e3:.0f} ms")
    save("history", data, args.json)
    return data


if __name__ == "__main__":
    main()
