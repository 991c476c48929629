"""One holder at a time, machine-wide, for tests that build fixed-name host resources.

The SSH and network-namespace tests create namespaces, bridges and sshd listeners under fixed
names and addresses: two test runs on one machine (two checkouts, a CI run beside a developer's)
would tear down or rekey each other's hosts mid-test.  Holding this lock for as long as those
resources exist makes the second run wait instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from typing import Iterator


@contextlib.contextmanager
def machine_wide(name: str) -> Iterator[None]:
    """Hold the lock ``name`` for the block (a file lock: released if the process dies)."""
    folder = "/run/lock" if os.access("/run/lock", os.W_OK) else tempfile.gettempdir()
    with open(os.path.join(folder, f"phalanx-tests-{name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
