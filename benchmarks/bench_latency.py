"""Iteration latency: a warm re-run of a one-step %%distributed_fit cell on 2 engines against a
cold torchrun launch of the same step.  Target: at least 100x faster.

    python benchmarks/bench_latency.py [--json OUT] [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import time

from _common import HERE, parse_args, save, stats, timed

ONE_STEP = """%%distributed_fit --shard X,y
opt = torch.optim.SGD(model.parameters(), lr=0.05)
opt.zero_grad()
torch.nn.functional.cross_entropy(model(X), y).backward()
opt.step()
"""


def cold_torchrun(repeats: int) -> dict:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2", str(HERE / "_torchrun_step.py"), "1", "32"],
                              capture_output=True, text=True, cwd=HERE)
        if done.returncode != 0:
            raise RuntimeError(f"torchrun failed:\n{done.stderr[-3000:]}")
        samples.append(time.perf_counter() - started)
    return stats(samples)


def warm_magic(repeats: int) -> dict:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "phalanx")
    shell.run_cell("%cluster start -n 2 --gpus none", silent=True)
    shell.run_cell("import torch\nfrom _models import make_mlp, make_data\n"
                   "model = make_mlp()\nX, y = make_data(64)\n", silent=True)

    def once() -> None:
        result = shell.run_cell(ONE_STEP, silent=True)
        if not result.success:
            raise RuntimeError(f"the benchmark cell failed: {result.error_in_exec!r}")

    try:
        return timed(once, repeats=repeats, warmup=2)
    finally:
        shell.run_cell("%cluster stop", silent=True)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)
    repeats = 3 if args.quick else 5
    cold = cold_torchrun(repeats)
    warm = warm_magic(repeats * 2)
    ratio = cold["median"] / warm["median"]
    data = {"cold_torchrun_s": cold, "warm_rerun_s": warm, "speedup": ratio, "target": ">= 100x",
            "met": ratio >= 100}
    print(f"cold torchrun launch : {cold['median'] * 1000:8.1f} ms (min {cold['min'] * 1000:.1f}, max {cold['max'] * 1000:.1f})")
    print(f"warm %%distributed_fit: {warm['median'] * 1000:8.1f} ms (min {warm['min'] * 1000:.1f}, max {warm['max'] * 1000:.1f})")
    print(f"speedup              : {ratio:8.1f}x  (target >= 100x)")
    save("latency", data, args.json)
    return data


if __name__ == "__main__":
    main()
