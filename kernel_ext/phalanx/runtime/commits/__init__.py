"""Commits and resume: what one commit of a run's training state holds, where it is kept
(replicated in memory and on disk, or sharded through torch's distributed checkpoint), and
``phalanx.steps(N)``, the loop whose boundaries commit and where a resumed run starts.

May import the wire, the transport and :mod:`phalanx.runtime.run`.
"""
