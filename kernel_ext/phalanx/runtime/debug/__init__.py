"""Looking into a rank: a failed run's frames for ``%debug``, ``breakpoint()`` in a run, and
the main thread's stack read from another thread (``%cluster stacks``).

May import the wire and :mod:`phalanx.runtime.run`.
"""
