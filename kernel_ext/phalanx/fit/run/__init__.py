"""One run from the kernel: options checked, the cell dispatched to every rank, the rendezvous
and its store, waiting for the ranks and turning the first fault into one error, recovery and
elastic resizes, what comes back to the notebook, and what stays on the engines.

May import the wire, :mod:`phalanx.cluster`, and the analysis, telemetry and exports rooms.
"""
