"""The kernel's side of looking into a rank: ``%debug`` after a failed run, a paused
``breakpoint()`` typed in the cell, and ``%cluster stacks``.
"""
