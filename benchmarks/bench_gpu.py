"""The checks and figures that need a CUDA device, run through the magic itself: an IPython
shell, ``%cluster start`` (one engine per GPU) and ``%%distributed_fit`` cells, as a notebook
runs them.

1. NCCL with world size 1: the run's group is NCCL, and ``allreduce`` / ``broadcast`` of CUDA
   tensors from the cell give the expected values.
2. fp16 autocast + GradScaler on CUDA, with clipping after ``unscale_`` and an overflow forced
   at one step: the run skips that step, keeps the scale history, and ends with the parameters
   of the same loop run plainly in this process.
3. CUDA memory: the run's per-rank peaks (allocated, reserved) beside the plain loop's
   ``torch.cuda.max_memory_allocated``.
4. Throughput, 1 worker through the magic (zero-change, and ``wrap()`` = DDP on NCCL) against
   the plain loop in this process and against torchrun + DDP on NCCL, for a GPU-bound MLP and
   for the small MLP of bench_throughput (where per-step overhead shows).  The same loop sent
   to the engine with ipyparallel's ``execute`` (no phalanx run around it) splits a gap into
   what the engine process costs and what the run costs.

Without CUDA it records ``{"skipped": ...}`` and exits 0.

    python benchmarks/bench_gpu.py [--json OUT] [--quick]
"""

from __future__ import annotations

import time
from pathlib import Path

from _common import parse_args, save, stats
from _gpu_loops import (MODELS, SMALL, TORCHRUN, engine_rate, magic_rate, plain, plain_rate,
                        run_cell, torchrun_rate)

AMP_SETUP = """
import torch
torch.manual_seed(0)
X = torch.randn(256, 32)
y = (X @ torch.linspace(-1.0, 1.0, 32)).unsqueeze(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
"""

# The overflow at step OVERFLOW is what fp16 loss scaling meets now and then: the scaler must
# skip that step and halve its scale, everywhere.
AMP_LOOP = """
model = model.to(device)
Xd, yd = X.to(device), y.to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 14, growth_interval=4)
scales, losses = [], []
for step in range(12):
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = ((model(Xd) - yd) ** 2).mean()
    if step == OVERFLOW:
        loss = loss * float("inf")
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    scales.append(scaler.get_scale())
    losses.append(float(loss))
model = model.cpu()
"""

NCCL_CELL = """
import torch, torch.distributed as dist
from phalanx import allreduce, broadcast
backend = dist.get_backend() if dist.is_initialized() else None
t = torch.arange(4, dtype=torch.float32, device=device) + rank
summed = allreduce(t.clone(), op="sum").cpu()
half = allreduce(torch.ones(3, dtype=torch.float16, device=device), op="mean").cpu()
sent = broadcast(torch.full((2,), 7.0, device=device) if rank == 0 else torch.zeros(2, device=device)).cpu()
where = str(device)
"""

# A model whose parameters, gradients and momentum take about 10 GB, built on the GPU: run as a
# cell several times, as a person re-runs a cell while working on it.
RERUN = """
import torch
start_allocated_mb = torch.cuda.memory_allocated() / 2**20
net = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192, bias=False, device=device) for _ in range(12)])
opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
x = torch.randn(64, 8192, device=device)
for step in range(2):
    opt.zero_grad()
    net(x).square().mean().backward()
    opt.step()
peak_mb = torch.cuda.max_memory_allocated() / 2**20
"""

def check_nccl(shell) -> dict:
    run_cell(shell, "%%distributed_fit --no-widget --return backend,summed,half,sent,where\n" + NCCL_CELL)
    ns = shell.user_ns
    ok = (ns["backend"] == "nccl" and ns["summed"].tolist() == [0.0, 1.0, 2.0, 3.0]
          and ns["half"].tolist() == [1.0, 1.0, 1.0] and ns["sent"].tolist() == [7.0, 7.0]
          and ns["where"].startswith("cuda"))
    return {"backend": ns["backend"], "device": ns["where"], "allreduce_sum": ns["summed"].tolist(),
            "allreduce_mean_fp16": ns["half"].tolist(), "broadcast": ns["sent"].tolist(), "ok": ok}


def check_amp(shell) -> dict:
    import torch

    overflow = 5
    run_cell(shell, AMP_SETUP + f"\nOVERFLOW = {overflow}\n")
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --return model,scales,losses\n" + AMP_LOOP)
    magic = {k: shell.user_ns[k] for k in ("model", "scales", "losses")}
    ref = plain(AMP_SETUP + AMP_LOOP, {"OVERFLOW": overflow})
    diff = max(float((a.detach() - b.detach()).abs().max())
               for a, b in zip(magic["model"].parameters(), ref["model"].parameters()))
    # The forced overflow halves the scale at that step and leaves the parameters untouched.
    halved = magic["scales"][overflow] == magic["scales"][overflow - 1] / 2
    return {"scales": magic["scales"], "reference_scales": ref["scales"],
            "final_loss": magic["losses"][-1], "max_param_diff_vs_plain": diff,
            "overflow_step": overflow, "scale_halved_at_overflow": halved,
            "ok": diff <= 1e-5 and magic["scales"] == ref["scales"] and halved
            and torch.isfinite(torch.tensor(magic["losses"][overflow + 1:])).all().item()}


def check_rerun_memory(shell, session, runs: int = 5) -> dict:
    """Re-run a cell holding ~10 GB: the memory each run starts with and its peak, through the
    magic and, as the baseline, the same code re-run in one namespace of this process (a plain
    notebook, where the names the cell rebinds keep the last run's model until then)."""
    import gc

    import torch

    magic_start, magic_peak = [], []
    for _ in range(runs):
        run_cell(shell, "%%distributed_fit --no-widget --return start_allocated_mb,peak_mb\n" + RERUN)
        magic_start.append(round(shell.user_ns["start_allocated_mb"]))
        magic_peak.append(round(shell.user_ns["peak_mb"]))
    run_cell(shell, "%%distributed_fit --no-widget\nnet = opt = x = None\n")
    plain_start, plain_peak, failed = [], [], None
    ns = {"device": torch.device("cuda", 0)}
    for _ in range(runs):
        torch.cuda.reset_peak_memory_stats()
        try:
            exec(RERUN, ns)
        except torch.OutOfMemoryError as exc:
            failed = str(exc).splitlines()[0]
            break
        plain_start.append(round(ns["start_allocated_mb"]))
        plain_peak.append(round(ns["peak_mb"]))
    ns.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return {"magic_start_allocated_mb": magic_start, "magic_peak_mb": magic_peak,
            "plain_start_allocated_mb": plain_start, "plain_peak_mb": plain_peak,
            "plain_out_of_memory": failed,
            # each run starts with none of the last run's memory and peaks at one model's worth
            "ok": max(magic_start[1:]) <= 0.1 * magic_peak[0] and max(magic_peak) <= 1.1 * magic_peak[0]}


def check_profile(shell, session) -> dict:
    """``--profile 5`` of the GPU-bound loop: a trace with CUDA activity and a top-operator table;
    and the small MLP's speed in the engine before and after it (the engine outlives the profiled
    run: what the profiler leaves attached would slow every later run)."""
    width, hidden, batch = SMALL
    before = [engine_rate(session, width, hidden, 2000, batch) for _ in range(3)]
    magic_rate(shell, session, 1024, 4096, 20, 1024, False, flags="--profile 5")
    after = [engine_rate(session, width, hidden, 2000, batch) for _ in range(3)]
    report = session.last_run().profile
    top = report.top.get(0, [])[:5]
    ranks = report.ranks_in_trace()
    trace = Path(report.path)
    size_mb = round(trace.stat().st_size / 2**20, 2)
    trace.unlink()  # written beside the benchmarks: measured, not kept
    return {"cuda": report.cuda, "steps": report.steps, "ranks_in_trace": ranks, "trace_mb": size_mb,
            "top": [{"name": r["name"], "self_cuda_ms": r.get("self_cuda_ms")} for r in top],
            "ok": report.cuda and ranks == [0] and bool(top),
            "engine_small_before": before, "engine_small_after": after,
            "after_vs_before": stats(after)["median"] / stats(before)["median"]}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure here")
        data = {"skipped": "no CUDA device on this machine", "summary": []}
        save("gpu", data, args.json)
        return data
    from IPython.core.interactiveshell import InteractiveShell

    from phalanx._session import session_for_shell

    repeats = 3 if args.quick else 5
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "phalanx")
    started = time.perf_counter()
    run_cell(shell, "%cluster start --gpus auto")
    session = session_for_shell(shell)
    data: dict = {"cluster_start_s": time.perf_counter() - started,
                  "engines": [dict(r) for r in session.status().rows]}
    try:
        data["nccl"] = check_nccl(shell)
        print("NCCL world size 1:", data["nccl"])
        data["amp"] = check_amp(shell)
        print("fp16 autocast + GradScaler:", data["amp"])
        data["rerun_memory"] = check_rerun_memory(shell, session)
        print("re-run memory:", data["rerun_memory"])
        data["profile"] = check_profile(shell, session)
        print("--profile 5:", data["profile"])
        rates: dict = {}
        for label, width, hidden, batch, steps in MODELS:
            steps = min(steps, 100) if args.quick else steps
            samples: dict[str, list[float]] = {k: [] for k in ("plain", "engine", "torchrun_ddp", "magic",
                                                               "magic_wrap")}
            memory: dict = {}
            for _ in range(repeats):
                rate, memory["plain_peak_mb"] = plain_rate(width, hidden, steps, batch)
                samples["plain"].append(rate)
                samples["engine"].append(engine_rate(session, width, hidden, steps, batch))
                samples["torchrun_ddp"].append(torchrun_rate(width, hidden, steps, batch))
                rate, memory["magic"] = magic_rate(shell, session, width, hidden, steps, batch, False)
                samples["magic"].append(rate)
                rate, memory["magic_wrap"] = magic_rate(shell, session, width, hidden, steps, batch, True)
                samples["magic_wrap"].append(rate)
            med = {k: stats(v) for k, v in samples.items()}
            m = {k: v["median"] for k, v in med.items()}
            rates[label] = {"samples_per_s": med, "memory": memory, "width": width, "hidden": hidden,
                            "batch": batch, "steps": steps,
                            "ratios": {"magic_vs_plain": m["magic"] / m["plain"],
                                       "engine_vs_plain": m["engine"] / m["plain"],
                                       "magic_vs_engine": m["magic"] / m["engine"],
                                       "magic_wrap_vs_torchrun_ddp": m["magic_wrap"] / m["torchrun_ddp"],
                                       "magic_vs_torchrun_ddp": m["magic"] / m["torchrun_ddp"]}}
            print(label, {k: round(v, 1) for k, v in m.items()}, rates[label]["ratios"], memory)
        data["throughput"] = rates
        data["torchrun"] = TORCHRUN.record()
        data["engines_after"] = [dict(r) for r in session.status().rows]
    finally:
        run_cell(shell, "%cluster stop")
    data["summary"] = summary(data)
    save("gpu", data, args.json)
    return data


def summary(data: dict) -> list[dict]:
    rows = [{"name": "NCCL, world size 1: allreduce and broadcast of CUDA tensors in a cell",
             "value": None, "target": "exact", "met": data["nccl"]["ok"],
             "detail": f"backend {data['nccl']['backend']} on {data['nccl']['device']}"},
            {"name": "fp16 autocast + GradScaler (overflow forced at one step) vs plain loop",
             "value": data["amp"]["max_param_diff_vs_plain"], "target": "<= 1e-5, same scales",
             "met": data["amp"]["ok"], "detail": f"scales {data['amp']['scales'][:8]}..."},
            {"name": "a ~10 GB cell re-run 5 times: GPU memory the 5th run starts with (MB)",
             "value": data["rerun_memory"]["magic_start_allocated_mb"][-1],
             "target": "~0: nothing of the last run", "met": data["rerun_memory"]["ok"],
             "detail": f"plain notebook: {data['rerun_memory']['plain_start_allocated_mb']}"},
            {"name": "--profile 5 on CUDA: one trace, CUDA kernels in the top-operator table",
             "value": data["profile"]["trace_mb"], "target": "a trace (MB)", "met": data["profile"]["ok"],
             "detail": f"top: {data['profile']['top'][0]['name'] if data['profile']['top'] else '-'}"}]
    if "after_vs_before" in data["profile"]:
        p = data["profile"]
        rows.append({"name": "small MLP in the engine after a CUDA --profile run vs before",
                     "value": p["after_vs_before"], "target": ">= 0.97x", "met": p["after_vs_before"] >= 0.97,
                     "detail": f"samples/s before {[round(x) for x in p['engine_small_before']]}, "
                               f"after {[round(x) for x in p['engine_small_after']]}"})
    for label, r in data["throughput"].items():
        sps = r["samples_per_s"]
        mem = r["memory"]["magic"]
        rows.append({"name": f"{label} MLP: run's CUDA peak vs the engine's max_memory_allocated",
                     "value": (mem.get("cuda_peak_mb") or 0) / mem["engine_max_memory_allocated_mb"],
                     "target": "1.0 (within 1%)",
                     "met": abs((mem.get("cuda_peak_mb") or 0) - mem["engine_max_memory_allocated_mb"])
                     <= 0.01 * mem["engine_max_memory_allocated_mb"],
                     "detail": f"{mem.get('cuda_peak_mb')} MB vs {mem['engine_max_memory_allocated_mb']} MB; "
                               f"reserved {mem.get('cuda_reserved_mb')} MB; {mem['live_samples']} live samples"})
        run_peak = mem.get("cuda_peak_mb")
        rows.append({"name": f"{label} MLP: 1 worker zero-change vs plain loop on the GPU",
                     "value": r["ratios"]["magic_vs_plain"], "target": ">= 0.97x",
                     "met": r["ratios"]["magic_vs_plain"] >= 0.97,
                     "detail": f"baseline {sps['plain']['median']:.0f} samples/s; CUDA peak "
                               f"{run_peak} MB vs plain {r['memory']['plain_peak_mb']:.1f} MB"
                               + (f"; the loop in the engine without a run: {r['ratios']['engine_vs_plain']:.3f}x "
                                  "plain" if "engine_vs_plain" in r["ratios"] else "")})
        rows.append({"name": f"{label} MLP: 1 worker wrap() (DDP, NCCL) vs torchrun + DDP (NCCL)",
                     "value": r["ratios"]["magic_wrap_vs_torchrun_ddp"], "target": ">= 0.97x",
                     "met": r["ratios"]["magic_wrap_vs_torchrun_ddp"] >= 0.97,
                     "detail": f"baseline {sps['torchrun_ddp']['median']:.0f} samples/s"})
    return rows


if __name__ == "__main__":
    main()
