"""Kernels for tests, on Unix sockets rather than TCP ports.

jupyter_client picks a kernel's five TCP ports by finding them free, then hands them to the
kernel, which binds them a moment later.  Tests run in parallel and start controllers and
engines that bind ports of their own all the time, so now and then one takes a port in that
moment and the kernel dies with "Address already in use".  A kernel on Unix sockets (ZeroMQ's
ipc transport) has no ports to lose; its socket files are named by a unique prefix and removed
when the kernel shuts down.

Example::

    km = kernel_manager()
    km.start_kernel(env=dict(os.environ))
    NotebookClient(nb, config=ipc_config())  # nbclient makes its own kernel manager
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from typing import Any

from traitlets.config import Config


def ipc_prefix() -> str:
    """A fresh path prefix for one kernel's socket files (``<prefix>-<n>``)."""
    return os.path.join(tempfile.gettempdir(), f"phx-kernel-{uuid.uuid4().hex[:12]}")


def ipc_config() -> Config:
    """Configuration that puts kernels a client or server creates on Unix sockets."""
    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = ipc_prefix()
    return config


def kernel_manager(**kwargs: Any) -> Any:
    """A ``KernelManager`` for this interpreter's ``python3`` kernel, on Unix sockets."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3", transport="ipc", ip=ipc_prefix(), **kwargs)
    km.kernel_spec.argv[0] = sys.executable  # this virtual environment's Python
    return km
