"""The GPU check: what a machine with a GPU must show, in one command, in under 6 minutes.

Through the magic (an IPython shell, ``%cluster start`` with one engine per GPU, cells), step by
step: the device rule as the engine sees it; the quickstart notebook on the GPU engine; the warm
one-step re-run against a bare ipyparallel round trip to the same engine (the goal: at most 2x,
the live view included); Hugging Face ``Trainer`` with ``bf16=True`` on NCCL against the same
script under ``torchrun --nproc_per_node 1``; accelerate with ``mixed_precision="bf16"``;
Lightning with ``precision="bf16-mixed"``; ``wrap(model, shard=True)`` plain, with a bf16 policy
and with CPU offload, and ``fully_shard`` with ``CPUOffloadPolicy`` in a cell, each with its peak
CUDA memory; then ``bench_gpu.py --quick`` for its rows.  A step that fails is recorded with its
error and the next one runs.  Without CUDA every step says "skipped: no GPU" and the command
exits 0.

Results: ``results/gpu-check-<machine-kind>.json`` and ``.md`` (a table, the machine and the
versions), or ``--json OUT`` (the table beside it, ``.md``).

    python benchmarks/gpu_check.py [--json OUT] [--only STEP ...]
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from _common import RESULTS, engine_env, machine, machine_kind
from _gpu_check_steps import BUDGET_S, STEPS, Step, run_cell

SKIPPED = "skipped: no GPU"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None, help="results file (default: results/gpu-check-<kind>.json)")
    parser.add_argument("--only", nargs="*", default=None, help="run only steps whose name has one of these")
    args = parser.parse_args(argv)
    engine_env()
    steps = [s for s in STEPS if not args.only or any(o in s.name for o in args.only)]
    started = time.perf_counter()

    def record(rows: list[dict]) -> None:  # after every step: a check cut off keeps what ran
        write(rows, time.perf_counter() - started, args.json)

    rows = run_steps(steps, record) if cuda_available() else [skipped(s) for s in steps]
    for row in rows:
        print(f"{row['step']}: {row['status']}", flush=True)
    record(rows)
    return rows


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def skipped(step: Step) -> dict:
    return {"step": step.name, "status": SKIPPED, "seconds": 0.0, "figures": {}}


def run_steps(steps: list[Step], record: Callable[[list[dict]], None]) -> list[dict]:
    """Every step on one GPU cluster, each timed; a failure is recorded and the next step runs.
    ``record`` gets the rows so far after each step."""
    from IPython.core.interactiveshell import InteractiveShell

    from phalanx._session import session_for_shell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "phalanx")
    ctx: dict[str, Any] = {"shell": shell}
    rows = []
    try:
        for step in steps:
            began = time.perf_counter()
            try:
                if step.cluster and "session" not in ctx:
                    run_cell(shell, "%cluster start --gpus auto")
                    ctx["session"] = session_for_shell(shell)
                elif not step.cluster and "session" in ctx:
                    run_cell(shell, "%cluster stop")
                    ctx.pop("session")
                figures = step.run(ctx)
                status = "failed" if figures.pop("failed", None) else "ok"
            except Exception as exc:
                figures = {"error": f"{type(exc).__name__}: {exc}"[:2000],
                           "traceback": traceback.format_exc()[-3000:]}
                status = "failed"
            rows.append({"step": step.name, "status": status, "figures": figures,
                         "seconds": round(time.perf_counter() - began, 1)})
            print(f"{step.name}: {status} in {rows[-1]['seconds']} s {short(figures)}", flush=True)
            record(rows)
    finally:
        if "session" in ctx:
            shell.run_cell("%cluster stop", store_history=False)
    return rows


def short(figures: dict) -> str:
    shown = {k: v for k, v in figures.items() if k not in ("traceback", "rows")}
    text = json.dumps(shown, default=str)
    return text if len(text) < 300 else text[:300] + "..."


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in ("phalanx", "torch", "transformers", "accelerate", "lightning", "ipyparallel"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def write(rows: list[dict], wall_s: float, path: str | None) -> Path:
    target = Path(path) if path else RESULTS / f"gpu-check-{machine_kind()}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine(), "versions": versions(), "wall_s": round(wall_s, 1),
            "budget_s": BUDGET_S, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": rows}
    target.write_text(json.dumps(data, indent=2, default=str) + "\n")
    target.with_suffix(".md").write_text(table(data))
    return target


def table(data: dict) -> str:
    m = data["machine"]
    lines = [f"# GPU check on `{m.get('kind')}`", "",
             f"{m.get('gpu', 'no GPU')}; {m.get('cpu')}, {m.get('cores')} cores; "
             + ", ".join(f"{k} {v}" for k, v in data["versions"].items())
             + f". Whole check {data['wall_s']} s (budget {data['budget_s']} s), {data['measured_at']}.",
             "", "| step | status | s | figures |", "|---|---|---|---|"]
    for row in data["steps"]:
        figures = row["figures"].get("error") or short(row["figures"])
        lines.append(f"| {row['step']} | {row['status']} | {row['seconds']} | "
                     f"{str(figures).replace('|', '/')} |")
    for row in data["steps"]:
        for sub in row["figures"].get("rows", []):
            lines.append(f"| {row['step']}: {sub.get('name')} | "
                         f"{'ok' if sub.get('met') else 'not met'} | | {sub.get('value')} "
                         f"(target {sub.get('target')}); {sub.get('detail', '')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
