"""Data-parallel sync on an engine: gradient averaging in buckets when ``backward()`` ends, the
zero-change hooks around a person's own loop, ``wrap()``/``no_sync()``, uneven inputs (join),
the sync strategies, the collectives a cell calls, sharded models, and the divergence guard.

A new strategy is a :class:`~phalanx.runtime.sync._strategies.SyncStrategy` subclass, built in
here or installed through the ``phalanx.strategies`` entry point group.  May import the wire, the
transport, :mod:`phalanx.runtime.run` and :mod:`phalanx.runtime.telemetry`.
"""
