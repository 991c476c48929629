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
4. The live stream to a lab panel: rows and bytes of JSON a panel receives for 8 ranks logging
   1,000 and 10,000 times a second each (10 s of simulated time through the real run tracker,
   digest and lab comm; the comm and the clock are stand-ins).  Baseline: every row, as the
   panel got them before the stream was thinned, measured in the same run.  Target: the rows a
   panel gets per rank and second do not grow with the logging rate.

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
    from phalanx.fit.telemetry._tracker import RunTracker

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


class _Panel:
    """Stands in for a panel's comm and for the kernel's comm manager: records what is sent."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.targets: dict = {}

    def register_target(self, name, opened) -> None:
        self.targets[name] = opened

    def unregister_target(self, name, opened) -> None:
        self.targets.pop(name, None)

    def on_msg(self, callback) -> None:
        pass

    def on_close(self, callback) -> None:
        pass

    def send(self, data) -> None:
        self.sent.append(data)

    def close(self) -> None:
        pass


class _Clock:
    """Simulated time for the lab comm's throttle: timers fire as time is advanced."""

    def __init__(self) -> None:
        self.now, self.timers = 0.0, []

    def schedule(self, delay, fn):
        self.timers.append((self.now + delay, fn))
        return lambda: None

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, fn in due:
            fn()


def panel_stream(per_rank_per_s: int, thinned: bool, seconds: int = 10) -> dict:
    """What one panel receives while 8 ranks log ``per_rank_per_s`` rows a second each."""
    import json

    import numpy as np

    from phalanx import _labcomm, events
    from phalanx._session import Session
    from phalanx.events import COMM_TARGET
    from phalanx.fit.telemetry._tracker import RunTracker

    directory = tempfile.mkdtemp(prefix="phalanx-bench-stream-")
    thin = _labcomm.thin_metrics
    if not thinned:
        _labcomm.thin_metrics = lambda event: event   # every row, as before
    try:
        session, panel, clock = Session(), _Panel(), _Clock()
        lab = _labcomm.LabComm(session, comm_manager=panel, create_comm=lambda **kw: _Panel(),
                               clock=lambda: clock.now, schedule=clock.schedule)
        lab.register()
        panel.targets[COMM_TARGET](panel, {"content": {"data": {}}})
        tracker = RunTracker("stream-1", RANKS, None, session.events.emit, history_dir=directory)
        session.events.emit(events.run_started("stream-1", RANKS, None, "allreduce"))
        rng, tick = np.random.default_rng(0), per_rank_per_s // 10
        started = time.process_time()
        for k in range(seconds * 10):   # a publish every 0.1 s, as the tracker's thread does
            steps = range(k * tick, (k + 1) * tick)
            for rank in range(RANKS):
                values = rng.random((tick, 2)).tolist()
                tracker.on_batch({"rank": rank, "step": steps[-1], "rows": [
                    [s, 1e9 + s * 1e-3, {"loss": v[0], "acc": v[1]}] for s, v in zip(steps, values)]})
            tracker.publish()
            clock.advance(0.1)
        tracker.drain()
        clock.advance(1.0)
        cpu = time.process_time() - started
        lab.close()
        sent = [m for m in panel.sent if m["type"] == "metrics"]
        rows = sum(len(m["rows"]) for m in sent)
        return {"logged_rows": RANKS * seconds * 10 * tick, "panel_rows": rows,
                "panel_rows_per_rank_per_s": rows / RANKS / seconds,
                "panel_bytes": sum(len(json.dumps(m)) for m in sent), "messages": len(sent),
                "kernel_cpu_s": cpu}
    finally:
        _labcomm.thin_metrics = thin
        shutil.rmtree(directory, ignore_errors=True)


def _time(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    from phalanx.fit.telemetry._history import MetricHistory

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
    data["stream"] = {str(rate): {"thinned": panel_stream(rate, True), "every_row": panel_stream(rate, False)}
                      for rate in (1_000, 10_000)}
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
    for rate, both in data["stream"].items():
        mine, base = both["thinned"], both["every_row"]
        both["ratio_bytes"] = mine["panel_bytes"] / base["panel_bytes"]
        print(f"panel stream, 8 ranks x {int(rate):,} log()/s: {mine['panel_rows_per_rank_per_s']:.0f} rows "
              f"per rank and second, {mine['panel_bytes'] / 1e6:.2f} MB in 10 s "
              f"(every row: {base['panel_rows_per_rank_per_s']:.0f}, {base['panel_bytes'] / 1e6:.2f} MB; "
              f"{both['ratio_bytes']:.3f}x the bytes)")
    save("history", data, args.json)
    return data


if __name__ == "__main__":
    main()
