""""Did you mean ...?" for a name or a flag someone typed (pure: stdlib ``difflib`` only).

A typo is the commonest first mistake; naming the closest real thing turns a search through
the notebook into a one-word fix.

Example::

    >>> did_you_mean("ytrr", ["Xtr", "ytr", "model"])
    "did you mean 'ytr'?"
    >>> did_you_mean("--shrad", ["--shard", "--sync"], show=str)
    'did you mean --shard?'
    >>> did_you_mean("zzz", ["model"])
    ''
"""

from __future__ import annotations

import difflib
from typing import Callable, Iterable


def close_matches(word: str, candidates: Iterable[str], n: int = 2) -> list[str]:
    """Up to ``n`` candidates close to ``word``, closest first; one differing only in case
    first of all (``xtr`` for ``Xtr``: difflib rates case changes like any other letter)."""
    pool = sorted({c for c in candidates if c and c != word})
    same_case = [c for c in pool if c.lower() == word.lower()]
    rest = [c for c in difflib.get_close_matches(word, pool, n=n) if c not in same_case]
    return (same_case + rest)[:n]


def did_you_mean(word: str, candidates: Iterable[str], show: Callable[[str], str] = repr,
                 n: int = 2) -> str:
    """``"did you mean 'x'?"`` (or ``'x' or 'y'``: up to ``n``) for the closest candidates,
    ``""`` when none is close; ``show`` writes each one (``repr`` for names, ``str`` for flags)."""
    found = close_matches(word, candidates, n)
    return f"did you mean {' or '.join(show(c) for c in found)}?" if found else ""


def joined(message: str, hint: str) -> str:
    """``message`` with ``hint`` after it, as one line (``message`` alone without a hint)."""
    return f"{message}; {hint}" if hint else message
