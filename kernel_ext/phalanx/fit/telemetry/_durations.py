"""How long something took, in words every view shares (pure): the cell's header, its summary,
the text record and the panel (``labextension/src/format.ts`` says it the same way).

Example::

    >>> fmt_duration(125), fmt_wall(2.3149)
    ('2 min 05 s', '2.31 s')
"""

from __future__ import annotations


def fmt_wall(seconds: float | None) -> str:
    """A finished run's wall time, said the same in the cell's header, its summary and the
    panel: ``2.31 s`` under a minute, else as :func:`fmt_duration`.

    Example::

        >>> fmt_wall(2.3149), fmt_wall(75)
        ('2.31 s', '1 min 15 s')
    """
    if seconds is not None and seconds == seconds and 0 <= seconds < 59.995:
        return f"{seconds:.2f} s"
    return fmt_duration(seconds)


def fmt_duration(seconds: float | None) -> str:
    """``42 s``, ``2 min 05 s``, ``1 h 02 min``; ``–`` when unknown.

    Example::

        >>> fmt_duration(3725)
        '1 h 02 min'
    """
    if seconds is None or seconds != seconds or seconds < 0:
        return "–"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
