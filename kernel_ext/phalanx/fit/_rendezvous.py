"""Where a run's ranks meet and report: the group rendezvous and the metric stream.

A :class:`Rendezvous` holds what the kernel opens for the engines of a run and keeps between runs:

- a private scratch directory (mode 0700, made at the first run, gone with the kernel; a killed
  kernel's is removed by the next one): the file store of a one-host group, the run's metric
  history, the elastic-resize signal files;
- across hosts, torch's TCPStore server, listening only on the address on the route to the
  engines (never every interface), with a secret shared with this cluster's engines only;
- the :class:`~._receiver.MetricsReceiver` the ranks stream their metrics to: on loopback for
  local engines, else on that same address.

Example::

    rendezvous = Rendezvous()
    store = rendezvous.store_for(slots, group_key)   # ("file", path) or ("tcp", ip, port, secret)
    receiver = rendezvous.receiver_for(slots)
    rendezvous.release_listeners()                    # the cluster stopped
    rendezvous.close()                                # the kernel goes
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from .._scratch import ScratchDir, reap_orphans
from ..cluster._locality import is_local
from ._dispatch import reachable_ip
from ._receiver import MetricsReceiver


class Rendezvous:
    """The rendezvous directory, the cross-host TCPStore and the metrics receiver of a runner."""

    def __init__(self) -> None:
        reap_orphans()  # a killed kernel's scratch directories
        self._scratch = ScratchDir("rdzv")
        self._secret = secrets.token_hex(16)  # shared with this cluster's engines only
        self.tcp_store: Any = None            # across hosts: torch's TCPStore server
        self.tcp_store_ip: str | None = None  # ... listening on this address only
        self.receiver: MetricsReceiver | None = None

    @property
    def directory(self) -> str:
        """The private rendezvous directory (0700: owner only), made on first use."""
        return self._scratch.path

    def store_for(self, slots: list, key: str) -> tuple:
        """Where group ``key`` of these engines meets: a file store for one host, else the TCP
        store (started, or restarted on another address, as the engines' network needs)."""
        # One host: a private file store, and no TCP server left from an earlier cluster that
        # spanned hosts (it would listen on that cluster's network for nothing).
        if all(is_local(s) for s in slots):
            self.tcp_store = None
            return ("file", os.path.join(self.directory, key))
        bind_ip = reachable_ip(_remote_address(slots))
        if self.tcp_store is None or self.tcp_store_ip != bind_ip:
            self.tcp_store, self.tcp_store_ip = None, bind_ip
            self.tcp_store = tcp_store_on(bind_ip)
        return ("tcp", bind_ip, self.tcp_store.port, self._secret)

    def receiver_for(self, slots: list) -> MetricsReceiver:
        """The metrics receiver these engines can reach (started, or replaced, as needed)."""
        # Local engines report on loopback; across hosts only the interface on the route to the
        # engines listens, not every one.  A receiver bound for another cluster is replaced: the
        # network it listened on (a remote cluster's) may be gone, and loopback is unreachable
        # from another host.
        local = all(is_local(s) for s in slots)
        bind_ip = "127.0.0.1" if local else reachable_ip(_remote_address(slots))
        if self.receiver is None or self.receiver.bind_ip != bind_ip:
            if self.receiver is not None:
                self.receiver.close()
            self.receiver = MetricsReceiver(bind_ip)
        return self.receiver

    def release_listeners(self) -> None:
        """Close the sockets opened for the engines (metric stream, TCP rendezvous): a stopped
        cluster's network needs none, and the next run opens what its cluster needs."""
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        self.tcp_store = self.tcp_store_ip = None

    def close(self) -> None:
        """Release the listeners and remove the rendezvous directory."""
        self.release_listeners()
        self._scratch.remove()


def tcp_store_on(bind_ip: str) -> Any:
    """A TCPStore server listening on ``bind_ip`` only.  Given a host name, torch's server binds
    every interface; handed a socket already bound to one address, it listens there."""
    import datetime
    import socket

    import torch.distributed as dist

    family = socket.AF_INET6 if ":" in bind_ip else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_ip, 0))
        sock.listen(512)
        port = sock.getsockname()[1]
        store = dist.TCPStore(bind_ip, port, None, True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=300),
                              master_listen_fd=sock.fileno(), use_libuv=True)
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the descriptor now and closes it
    return store


def _remote_address(slots: list) -> str:
    """An engine address off this host: the kernel advertises its address on the route there
    (a local engine would give loopback, which the others cannot reach)."""
    return next((s.address for s in slots if not is_local(s)), slots[0].address)
