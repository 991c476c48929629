"""What a cell needs from the notebook, read from its code before anything is sent: the names it
reads by Python's scoping rules (:mod:`._names_read`, with the walk's state in
:mod:`._walk_state` and code that runs later in :mod:`._deferred_code`), the checks and packing
of what is shipped, "did you mean" suggestions, and the manifest to reproduce a run.

Pure (stdlib ``ast``), apart from the packing; imports only the wire.
"""
