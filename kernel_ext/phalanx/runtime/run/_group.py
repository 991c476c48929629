"""The warm process group of an engine: formed once per engine set, reused by later cells.

The kernel hosts the rendezvous and gives every run a :class:`GroupSpec`.  On one host that is a
private ``FileStore`` (nothing listens); across hosts it is the kernel's CurveZMQ store server,
which the engines reach through :class:`~._store_client.CurveStore` with the keys the spec
carries: encrypted, and closed to any peer without them (torch's ``TCPStore`` would answer anyone
on the network).  The spec's ``key`` changes only when the engine set changes (scale, restart) or
the previous group was torn down by a failure, so re-running a cell finds the group already formed
and costs no rendezvous.

Three transports can sit under one group, picked per call by :class:`Collectives`:

* torch.distributed (gloo for CPU tensors, NCCL for CUDA) - always formed, DDP needs it;
* shared memory between engines on one host - the fast CPU path;
* MPI through mpi4py when the engines were launched under one ``mpiexec``.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...wire._seam import GroupSpec

if TYPE_CHECKING:
    from ..transport._comm_mpi import MpiCommunicator
    from ..transport._comm_torch import TorchCommunicator
    from ..transport._shm import ShmCommunicator

log = logging.getLogger("phalanx")


@dataclass
class GroupHandle:
    """A formed group and its communicators."""

    spec: GroupSpec
    torch_comm: TorchCommunicator | None = None
    shm_comm: ShmCommunicator | None = None
    mpi_comm: MpiCommunicator | None = None
    healthy: bool = True
    extra: dict = field(default_factory=dict)

    def communicators(self) -> list:
        return [c for c in (self.shm_comm, self.mpi_comm, self.torch_comm) if c is not None]

    def close(self) -> None:
        """Tear everything down (also after a failure: a later run forms a fresh group)."""
        for comm in (self.shm_comm, self.mpi_comm):
            if comm is not None:
                try:
                    comm.close()
                except Exception as exc:
                    log.warning("phalanx: closing %s failed: %s", type(comm).__name__, exc)
        self.shm_comm = self.mpi_comm = None
        _destroy_torch_group()
        self.torch_comm = None
        self.healthy = False
        store = self.extra.pop("store", None)
        if hasattr(store, "close"):  # the CurveStore's socket (a FileStore has nothing to close)
            store.close()


def ensure_group(current: GroupHandle | None, spec: GroupSpec) -> GroupHandle:
    """Reuse ``current`` when it is the group ``spec`` describes, else form a new one."""
    if current is not None and current.healthy and current.spec.key == spec.key \
            and current.spec.rank == spec.rank:
        return current
    if current is not None:
        current.close()
    return form_group(spec)


def form_group(spec: GroupSpec) -> GroupHandle:
    """Rendezvous through the kernel's store and build the communicators."""
    import torch.distributed as dist

    from ..transport._comm_torch import TorchCommunicator

    _destroy_torch_group()
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store: dist.Store
    if spec.store[0] == "file":
        # One host: rendezvous through a private file and keep gloo on the loopback interface,
        # so a local cluster opens no port beyond this machine.
        store = dist.FileStore(spec.store[1], spec.world_size)
        _use_loopback_for_gloo()
    else:
        from ._store_client import CurveStore

        host, port, server_public, client_public, client_secret = spec.store[1:6]
        store = CurveStore(host, port, server_public, client_public, client_secret, timeout)
        _use_interface_towards(spec.store[1])
    prefixed = dist.PrefixStore(spec.key, store)
    torch_backend = "nccl" if spec.backend == "nccl" else "gloo"
    try:
        dist.init_process_group(torch_backend, store=prefixed, rank=spec.rank,
                                world_size=spec.world_size, timeout=timeout)
    except BaseException:
        if hasattr(store, "close"):  # a failed rendezvous leaves no socket behind
            store.close()
        raise
    # Across hosts torch is the CPU transport too: give it the store so its heartbeats can name
    # a rank that stalls or dies (on one host shared memory does that, and a FileStore is an
    # append-only file that heartbeats would grow forever).
    beats = prefixed if spec.store[0] != "file" else None
    handle = GroupHandle(spec, torch_comm=TorchCommunicator(timeout_s=spec.timeout_s, store=beats))
    handle.extra["store"] = store
    if spec.backend == "mpi":
        from mpi4py import MPI

        from ..transport._comm_mpi import MpiCommunicator

        handle.mpi_comm = MpiCommunicator(MPI.COMM_WORLD)
    elif spec.backend != "nccl" and len(set(spec.hosts)) == 1:
        from ..transport._shm import ShmCommunicator

        group_id = hashlib.sha1(spec.key.encode()).hexdigest()[:12]
        handle.shm_comm = ShmCommunicator(group_id, spec.rank, spec.world_size,
                                          list(spec.pids) or None, spec.timeout_s)
    return handle


def _use_loopback_for_gloo() -> None:
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(getattr(a, "address", "").startswith("127.") for a in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def _use_interface_towards(host: str) -> None:
    """Let gloo listen on the interface that routes to ``host`` (the kernel's rendezvous),
    not on whatever the machine's hostname resolves to (often loopback or another network)."""
    import socket

    import psutil

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))  # no packet is sent: this only asks the routing table
        mine = probe.getsockname()[0]
    except OSError:
        return
    finally:
        probe.close()
    for name, addresses in psutil.net_if_addrs().items():
        if any(getattr(a, "address", None) == mine for a in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def _destroy_torch_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # a group broken by a dead peer may refuse a clean shutdown
        log.warning("phalanx: destroying the torch process group failed: %s", exc)
