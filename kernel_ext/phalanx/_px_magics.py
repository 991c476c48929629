"""ipyparallel's ``%px`` magics, kept on the cluster that runs now.

ipyparallel gives the shell ``%px``, ``%%px``, ``%autopx``, ``%pxresult`` and ``%pxconfig`` when
the first client of the kernel connects, bound to that client.  A later client (``%cluster
stop``, then ``start``) finds ``%px`` there and leaves it alone: ``%px`` kept sending to the
stopped cluster ("Client cannot be used after its sockets have been closed"), and the shell kept
the stopped client, its sockets included, for the rest of the session.

So a stop takes the magics bound to its client off the shell, and ``%px`` then says that no
cluster runs; a start binds them to its own client.

Example (what :class:`~phalanx._session.Session` does)::

    client = cluster.client
    cluster.stop()
    after_stop(shell, client)      # %px: "no cluster is running ..."
    cluster.start(n=2)
    after_start(shell, cluster.client)
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

_NO_CLUSTER = ("no cluster is running: start one with %cluster start -n 2, and %px runs on "
               "its engines")


@magics_class
class NoClusterMagics(Magics):
    """``%px`` and its kin while no cluster runs: each says so."""

    @line_cell_magic
    def px(self, line: str, cell: str | None = None) -> None:
        raise UsageError(_NO_CLUSTER)

    @line_magic
    def autopx(self, line: str) -> None:
        raise UsageError(_NO_CLUSTER)

    @line_magic
    def pxresult(self, line: str) -> None:
        raise UsageError(_NO_CLUSTER)

    @line_magic
    def pxconfig(self, line: str) -> None:
        raise UsageError(_NO_CLUSTER)


def after_stop(shell: Any, client: Any) -> None:
    """Take the magics bound to ``client`` (a stopped cluster's) off ``shell``; ``%px`` then
    says that no cluster runs."""
    if shell is None or client is None:
        return
    stale = [m for m in list(shell.configurables) if _bound_to(m, client)]
    for magics in stale:
        _unregister(shell, magics)
    if stale and "px" not in shell.magics_manager.magics["line"]:
        shell.magics_manager.register(NoClusterMagics(shell=shell))


def after_start(shell: Any, client: Any) -> None:
    """Bind ``%px`` to ``client`` (a cluster just started) where the shell's ``%px`` is the
    stand-in or a closed client's; ipyparallel itself binds it where the shell has none."""
    if shell is None or client is None:
        return
    owner = getattr(shell.magics_manager.magics["line"].get("px"), "__self__", None)
    if not isinstance(owner, NoClusterMagics) and not _on_closed_client(owner):
        return  # none (ipyparallel gave it to this client), or the user's own, on a live client
    for magics in list(shell.configurables):
        if isinstance(magics, NoClusterMagics) or _on_closed_client(magics):
            _unregister(shell, magics)
    client.activate()


def _client_of(magics: Any) -> Any:
    if type(magics).__name__ != "ParallelMagics":
        return None
    return getattr(getattr(magics, "view", None), "client", None)


def _bound_to(magics: Any, client: Any) -> bool:
    return client is not None and _client_of(magics) is client


def _on_closed_client(magics: Any) -> bool:
    client = _client_of(magics)
    return client is not None and bool(getattr(client, "_closed", False))


def _unregister(shell: Any, magics: Any) -> None:
    """Every magic ``magics`` provides leaves the shell's tables, and the shell lets it go."""
    manager = shell.magics_manager
    for table in manager.magics.values():
        for name, function in list(table.items()):
            if getattr(function, "__self__", None) is magics:
                del table[name]
    for name, registered in list(manager.registry.items()):
        if registered is magics:
            del manager.registry[name]
    if magics in shell.configurables:
        shell.configurables.remove(magics)
