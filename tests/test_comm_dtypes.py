"""Every dtype torch.distributed supports, through every CPU transport, against gloo itself.

Two real processes each form a gloo group and a shared-memory group, then reduce the same inputs
with raw ``torch.distributed`` (the expected result) and with ``TorchCommunicator``,
``ShmCommunicator`` and the run's dispatching ``Collectives``: torch tensors and numpy arrays,
0-dim, empty and non-contiguous, in place, every op.  The results must be bit-identical.

This file doubles as the worker: ``python tests/test_comm_dtypes.py <rank> <store_file> <gid>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from deadlines import hang_limit


HERE = Path(__file__).resolve()
KERNEL_EXT = HERE.parent.parent / "kernel_ext"
TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
                "uint8", "bool")
NUMPY_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                "bool")
OPS = ("sum", "mean", "max", "min")
SHAPES = ("vector", "0-dim", "empty", "non-contiguous")


def test_every_dtype_op_and_shape_matches_gloo(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(KERNEL_EXT), os.environ.get("PYTHONPATH", "")])}
    store, gid = tmp_path / "store", f"dt{os.getpid()}"
    procs = [subprocess.Popen([sys.executable, str(HERE), str(r), str(store), gid], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=hang_limit(240)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    report = json.loads(outs[0][0].strip().splitlines()[-1])
    assert report["checked"] > 400, report["checked"]
    assert not report["wrong"], "\n".join(report["wrong"][:40])


# -- the worker ----------------------------------------------------------------------------------


def _inputs(lib: str, dtype: str, shape: str, rank: int, seed: int):
    """This rank's input for one case, and the (contiguous) tensor holding the same values."""
    import torch

    g = torch.Generator().manual_seed(seed * 7 + rank)
    n = {"vector": 37, "0-dim": 1, "empty": 0, "non-contiguous": 2 * 37}[shape]
    tdtype = getattr(torch, dtype)
    if dtype == "bool":
        base = torch.randint(0, 2, (n,), generator=g).bool()
    elif tdtype.is_floating_point:
        base = (torch.randn(n, generator=g) * 3).to(tdtype)
    else:
        lo = 0 if dtype == "uint8" else -100
        base = torch.randint(lo, 120, (n,), generator=g).to(tdtype)  # int8 sums wrap, as in gloo
    if shape == "0-dim":
        base = base.reshape(())
    x = base if lib == "torch" else base.numpy().copy()
    if shape == "non-contiguous":
        x = x[::2]
    return x


def _expected(x, op: str, dist, torch):
    """Raw gloo on a contiguous copy (int16, which gloo refuses, through int32 and back)."""
    t = torch.as_tensor(x).clone().contiguous()
    work = t.to(torch.int32) if t.dtype == torch.int16 else t
    reduce_op = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM,
                 "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    if work.numel():
        dist.all_reduce(work, op=reduce_op)
    out = work.to(t.dtype)
    if op == "mean":
        out = out.div_(dist.get_world_size())
    return out


def _same(x, expected, torch) -> bool:
    got = torch.as_tensor(x)
    return got.dtype == expected.dtype and got.shape == expected.shape and \
        bool(torch.equal(got, expected))


def _check_case(transports, lib, dtype, op, shape, rank, seed, dist, torch, wrong) -> int:
    x = _inputs(lib, dtype, shape, rank, seed)
    floating = dtype.startswith("float") or dtype == "bfloat16"
    if op == "mean" and not floating:
        for name, comm in transports.items():
            try:
                comm.allreduce([_inputs(lib, dtype, shape, rank, seed)], op="mean")
                wrong.append(f"{name} {lib} {dtype} mean: accepted a non-float mean")
            except TypeError:
                pass
        return len(transports)
    expected = _expected(x, op, dist, torch)
    label = f"{lib} {dtype} {op} {shape}"
    return _each(transports, label, lambda: _inputs(lib, dtype, shape, rank, seed),
                 lambda comm, mine: comm.allreduce([mine], op=op), expected, torch, wrong)


def _check_broadcast(transports, lib, dtype, rank, dist, torch, wrong) -> int:
    expected = torch.as_tensor(_inputs(lib, dtype, "non-contiguous", 1, 99)).clone()
    return _each(transports, f"{lib} {dtype} broadcast",
                 lambda: _inputs(lib, dtype, "non-contiguous", rank, 99),
                 lambda comm, mine: comm.broadcast([mine], src=1), expected, torch, wrong)


def _each(transports, label, make, call, expected, torch, wrong) -> int:
    """``call(comm, fresh input)`` on every transport; the input must then equal ``expected``."""
    for name, comm in transports.items():
        mine = make()
        try:
            call(comm, mine)
        except Exception as exc:
            wrong.append(f"{name} {label}: {type(exc).__name__}: {exc}")
            continue
        if not _same(mine, expected, torch):
            wrong.append(f"{name} {label}: {mine!r} != {expected!r}")
    return len(transports)


def _transports(rank: int, store_file: str, gid: str) -> dict:
    import torch.distributed as dist

    from phalanx.runtime.sync._collectives import Collectives
    from phalanx.runtime.transport._comm_torch import TorchCommunicator
    from phalanx.runtime.run._group import GroupHandle, GroupSpec
    from phalanx.runtime.transport._shm import ShmCommunicator

    dist.init_process_group("gloo", store=dist.FileStore(store_file, 2), rank=rank, world_size=2)
    torch_comm = TorchCommunicator(timeout_s=60)
    shm = ShmCommunicator(gid, rank, 2, timeout_s=60)
    spec = GroupSpec(key=gid, rank=rank, world_size=2, store=("file", store_file), backend="gloo",
                     timeout_s=60)
    return {"torch": torch_comm, "shm": shm,
            "collectives": Collectives(GroupHandle(spec, torch_comm=torch_comm, shm_comm=shm))}


def worker(rank: int, store_file: str, gid: str) -> None:
    import torch
    import torch.distributed as dist

    transports = _transports(rank, store_file, gid)
    wrong: list[str] = []
    checked, seed = 0, 0
    for lib, dtypes in (("torch", TORCH_DTYPES), ("numpy", NUMPY_DTYPES)):
        for dtype in dtypes:
            for op in OPS:
                for shape in SHAPES:
                    seed += 1
                    checked += _check_case(transports, lib, dtype, op, shape, rank, seed, dist,
                                           torch, wrong)
            checked += _check_broadcast(transports, lib, dtype, rank, dist, torch, wrong)
    transports["shm"].close()
    transports["torch"].close()
    dist.destroy_process_group()
    print(json.dumps({"checked": checked, "wrong": wrong}), flush=True)


if __name__ == "__main__":
    worker(int(sys.argv[1]), sys.argv[2], sys.argv[3])
