"""``make chaos``: N runs on a real 2-engine cluster, each with one fault drawn at random.

Usage::

    python benchmarks/chaos.py [-n 50] [--seed 7] [--max-restarts 0]

Writes the figures (faults by kind, time to error p50/p95/max, internal errors, hangs, leaks) to
``benchmarks/results/chaos.json`` and ``chaos.md`` (``chaos-restarts.*`` with ``--max-restarts``)
and prints the table.  Exit status 1 when any
run ended in an internal error, a wrong or late error, a hang, a failed next cell or a leak.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _common import RESULTS, engine_env, machine
from _chaos import Chaos, draw_faults
from _chaos_figures import markdown, summarize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50, help="number of faults (default 50)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the draw (default 7)")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="run with --max-restarts N: every run must complete with the "
                             "parameters of the uninterrupted run")
    args = parser.parse_args(argv)
    engine_env()
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "phalanx")
    chaos = Chaos(shell, max_restarts=args.max_restarts)
    outcomes, started = [], time.monotonic()
    chaos.start()
    try:
        for i, fault in enumerate(draw_faults(args.n, args.seed)):
            outcome = chaos.run(fault)
            outcomes.append(outcome)
            print(f"[{i + 1}/{args.n}] {fault.kind} rank {fault.rank} at {fault.at}: "
                  f"{outcome.verdict} {outcome.time_to_error_s} s "
                  f"{'leaks: ' + ', '.join(outcome.leaks) if outcome.leaks else ''} {outcome.detail[:200]}",
                  flush=True)
    finally:
        final = chaos.stop()
    summary = summarize(outcomes, final)
    summary.update(seed=args.seed, max_restarts=args.max_restarts, machine=machine(),
                   wall_s=round(time.monotonic() - started, 1))
    RESULTS.mkdir(exist_ok=True)
    name = "chaos-restarts" if args.max_restarts else "chaos"  # the two modes keep their own figures
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=2, default=str))
    table = markdown(summary)
    (RESULTS / f"{name}.md").write_text(f"# Chaos runs (seed {args.seed}, {args.n} faults, "
                                      f"max restarts {args.max_restarts})\n\n" + table)
    print(table)
    bad = (summary["internal_errors"] + summary["wrong_errors"] + summary["hangs"]
           + summary["next_cell_failures"] + summary["runs_with_leaks"] + len(final))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
