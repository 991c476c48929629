"""Where a run's ranks meet and report: the group rendezvous and the metric stream.

A :class:`Rendezvous` holds what the kernel opens for the engines of a run and keeps between runs:

- a private scratch directory (mode 0700, made at the first run, gone with the kernel; a killed
  kernel's is removed by the next one): the file store of a one-host group, the run's metric
  history, the elastic-resize signal files;
- across hosts, the rendezvous store (:class:`~._store_server.StoreServer`), listening only on
  the address on the route to the engines (never every interface).  It speaks CurveZMQ: traffic
  is encrypted and only the client key made for it may connect - a peer without that key can
  neither list, read nor write the group's addresses.  The keys reach the engines inside each
  run's ``GroupSpec``, over ipyparallel's authenticated channel;
- the :class:`~phalanx.fit.telemetry._receiver.MetricsReceiver` the ranks stream their metrics to: on loopback for
  local engines (plain, token-checked), else on that same address over CurveZMQ like the store,
  admitting only its own client key (its keys travel in each run's ``RunSpec``).

Example::

    rendezvous = Rendezvous()
    store = rendezvous.store_for(slots, group_key)   # ("file", path) or ("curve", ip, port, keys...)
    receiver = rendezvous.receiver_for(slots)
    rendezvous.release_listeners()                    # the cluster stopped: nothing listens
    rendezvous.close()                                # the kernel goes
"""

from __future__ import annotations

import os

from ..._scratch import ScratchDir, reap_orphans
from ...cluster._locality import is_local
from ._dispatch import reachable_ip
from ..telemetry._receiver import MetricsReceiver
from ._store_server import StoreServer


class Rendezvous:
    """The rendezvous directory, the cross-host store server and the metrics receiver of a runner."""

    def __init__(self) -> None:
        reap_orphans()  # a killed kernel's scratch directories
        self._scratch = ScratchDir("rdzv")
        # across hosts: the authenticated store server (``.port``, ``.bind_ip``), on one address
        self.tcp_store: StoreServer | None = None
        self.receiver: MetricsReceiver | None = None

    @property
    def directory(self) -> str:
        """The private rendezvous directory (0700: owner only), made on first use."""
        return self._scratch.path

    def store_for(self, slots: list, key: str) -> tuple:
        """Where group ``key`` of these engines meets: a file store for one host, else the
        store server (started, or restarted on another address, as the engines' network needs);
        ``key`` prefixes the group's keys, so groups of later runs never meet old entries."""
        # One host: a private file store, and no server left from an earlier cluster that
        # spanned hosts (it would listen on that cluster's network for nothing).
        if all(is_local(s) for s in slots):
            self._stop_store()
            return ("file", os.path.join(self.directory, key))
        bind_ip = reachable_ip(_remote_address(slots))
        if self.tcp_store is None or self.tcp_store.bind_ip != bind_ip:
            self._stop_store()
            self.tcp_store = StoreServer(bind_ip)
        return self.tcp_store.spec()

    def _stop_store(self) -> None:
        if self.tcp_store is not None:
            self.tcp_store.close()
            self.tcp_store = None

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
        """Close the sockets opened for the engines (metric stream, rendezvous store): a stopped
        cluster's network needs none, and the next run opens what its cluster needs."""
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        self._stop_store()

    def close(self) -> None:
        """Release the listeners and remove the rendezvous directory."""
        self.release_listeners()
        self._scratch.remove()


def _remote_address(slots: list) -> str:
    """An engine address off this host: the kernel advertises its address on the route there
    (a local engine would give loopback, which the others cannot reach)."""
    return next((s.address for s in slots if not is_local(s)), slots[0].address)
