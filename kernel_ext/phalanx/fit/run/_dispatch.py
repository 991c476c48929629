"""Turn a cell and its options into what each rank receives (kernel side, no waiting).

:func:`prepare` resolves, checks and packs everything *before* anything is sent, so bad input
(unknown names, unpicklable objects, shards without rows, a flag that cannot work) is refused
with nothing started.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...wire._graph_pickle import GraphPacker
from ...wire._seam import shard_key
from ._fit_options import FitOptions, FitUsageError
from ..analysis._shipping import check_defined, check_same_rows, content_hash, pack, resolve_names, split_rows
from ._strategy import notebook_strategy

INJECTED = ("rank", "world_size", "device")


@dataclass
class Prepared:
    """Everything a run sends, per name and per rank."""

    blobs: dict[str, bytes]
    hashes: dict[str, str]
    shard_blobs: list[dict[str, bytes]]  # per rank: each shard's part, pickled
    shard_hashes: list[dict[str, str]] = field(default_factory=list)  # per rank: their hashes
    data_manifest: dict[str, dict] = field(default_factory=dict)
    strategy: str | None = None   # the shipped notebook name --sync refers to, if it is one
    memos: dict[str, dict] = field(default_factory=dict)  # what each name's pickle holds
    kept: tuple[str, ...] = ()    # names the engines keep live (--keep): not shipped

    def objects_for(self, rank: int) -> tuple[dict[str, str], dict[str, bytes]]:
        """(hashes, blobs) of what rank ``rank``'s engine must hold for the run: the shipped
        names and its own part of each ``--shard`` name (under :func:`shard_key`)."""
        hashes, blobs = dict(self.hashes), dict(self.blobs)
        for name, blob in self.shard_blobs[rank].items():
            hashes[shard_key(name)] = self.shard_hashes[rank][name]
            blobs[shard_key(name)] = blob
        return hashes, blobs


def describe(value: Any) -> dict:
    """Shape and type of a shipped object, for the manifest."""
    info: dict[str, Any] = {"type": type(value).__name__}
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple):  # torch.Size is a tuple too; modules may have shape functions
        info["shape"] = list(shape)
        info["dtype"] = str(getattr(value, "dtype", ""))
    elif isinstance(value, (list, tuple)):
        info["len"] = len(value)
    return info


def prepare(body: str, opts: FitOptions, user_ns: Mapping[str, Any], world_size: int,
            kept: tuple[str, ...] = ()) -> Prepared:
    """Resolve, check, shard and pickle what the cell needs (not the ``kept`` names: the
    engines hold them live, and they shadow the notebook's)."""
    check_defined("--shard", opts.train.shard, user_ns)
    strategy = notebook_strategy(opts.train.sync, user_ns)
    shipped = resolve_names(body, user_ns,
                            injected=set(INJECTED) | set(opts.train.shard) | set(kept))
    if strategy is not None:
        shipped[strategy] = user_ns[strategy]  # shipped like any notebook class, by value
    shards = {s: user_ns[s] for s in opts.train.shard}
    check_same_rows(shards)
    parts = {s: split_rows(s, v, world_size) for s, v in shards.items()}
    # One packer for all names, in the order the engines load them (sorted): what names share
    # in the notebook they share on the engines (see runtime/_graph_pickle)
    packer = GraphPacker(user_ns, bound=set(shipped) | set(opts.train.shard) | set(INJECTED)
                         | set(kept))
    blobs = {name: pack(name, shipped[name], functools.partial(packer.pack, name))
             for name in sorted(shipped)}
    hashes = {name: content_hash(blob) for name, blob in blobs.items()}
    # Each rank's part of each shard is pickled once, for both its rank and the shard's hash: a
    # large dataset is not serialised again for checking, sending and hashing.
    part_blobs = {s: [pack(f"{s} (rank {r}'s shard)", part) for r, part in enumerate(rows)]
                  for s, rows in parts.items()}
    shard_blobs = [{s: part_blobs[s][rank] for s in part_blobs} for rank in range(world_size)]
    shard_hashes = [{s: content_hash(blob) for s, blob in parts.items()} for parts in shard_blobs]
    data = {name: {**describe(user_ns[name]), "hash": hashes[name]} for name in blobs}
    for s, value in shards.items():
        data[s] = {**describe(value), "hash": content_hash(*part_blobs[s]),  # whole, for the manifest
                   "sharded": True}
    return Prepared(blobs, hashes, shard_blobs, shard_hashes, data, strategy, packer.memos, kept)


def choose_backend(opts: FitOptions, slots: list, launcher: str) -> str:
    """The transport family for this run; a usage error when the request cannot work."""
    devices = [s.device for s in slots]
    if opts.backend == "auto":
        return "nccl" if devices and all(d is not None for d in devices) else "gloo"
    if opts.backend == "nccl" and not all(d is not None for d in devices):
        raise FitUsageError("--backend nccl needs a GPU on every engine; these engines are CPU "
                            "engines (start them with --gpus auto on a GPU machine) or use gloo")
    if opts.backend == "mpi":
        sets = {s.engine_set_id for s in slots}
        ordered = all(s.info.get("mpi_rank") == r for r, s in enumerate(slots))
        if launcher != "mpi" or len(sets) != 1 or not ordered:
            raise FitUsageError("--backend mpi needs engines started together under MPI: "
                                "%cluster start -n N --launcher mpi (and no scaling since)")
    return opts.backend


def reachable_ip(peer: str) -> str:
    """This host's address on the route to ``peer`` (no packet is sent)."""
    from ...cluster._locality import route_address

    return route_address(peer)
