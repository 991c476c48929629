"""Time limits in the tests are deadlines against hangs, never measures of speed.

Each limit is written as what a quiet machine needs with room to spare and passed through
:func:`deadline`, which stretches it by the suite's one slowdown factor: ``PHALANX_TEST_SLOWDOWN``
where it is set, else 3.  The default covers a machine a few times slower than a quiet one (the
suite beside two CPU burners on two cores made process starts that import torch take 2-3 times
as long).  A test that passes never waits a deadline out, so a generous factor costs nothing; a
real hang only takes longer to be named.  pytest-timeout's per-test limit (pyproject.toml, 600
s) is the last guard, for a hang no deadline covers.

Example::

    proc.communicate(timeout=hang_limit(60))
"""

from __future__ import annotations

import os

SLOWDOWN = float(os.environ.get("PHALANX_TEST_SLOWDOWN") or 3.0)


def hang_limit(seconds: float) -> float:
    """``seconds`` on a quiet machine, stretched for a slow or busy one."""
    return seconds * SLOWDOWN
