"""What a rank reports while it trains: ``log()``'s metric rows and their sender, where its time
goes (step parts, collectives), its memory, and ``--profile`` traces.

A new per-rank figure is measured here and read on the kernel's side in
:mod:`phalanx.fit.telemetry`.  May import the wire and :mod:`phalanx.runtime.run`.
"""
