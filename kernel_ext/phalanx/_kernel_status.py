"""The kernel says busy for as long as a cell runs, whatever its subshells answer meanwhile.

ipykernel 7 publishes a ``busy`` and an ``idle`` status around every request it handles, on a
subshell (JEP 91) or the control channel too: the panel's comm messages and a widget's clicks
during a run.  JupyterLab's kernel connection (its status bar, the notebook's busy prompt) and
the server's record of the kernel's state take each status for the whole kernel's, so the
first panel request of a run made the status bar say "Idle" while the cell still ran.

Here an ``idle`` that another thread publishes while the main shell handles a request is
followed at once by a ``busy`` whose parent is that request: the other request still ends as
the protocol says (its clients see its ``idle``), and the kernel's last word is busy again, as
it is.  The main shell's own ``idle`` ends it, under the same lock, so nothing can say busy
after the cell has ended.

Example::

    status = KernelStatus.install(kernel)   # a kernel with subshells; idempotent
    status.uninstall()
"""

from __future__ import annotations

import threading
from typing import Any

_ATTRIBUTE = "_phalanx_kernel_status"


class KernelStatus:
    """Wraps ``kernel._publish_status``; the thread that installs it is the main shell's."""

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel
        self._publish = kernel._publish_status  # the kernel's own (bound) method
        self._main = threading.current_thread()
        self._lock = threading.Lock()
        self._running: Any = None  # the main shell's request while it handles one

    @classmethod
    def install(cls, kernel: Any) -> KernelStatus:
        """Wrap ``kernel``'s status publishing (once per kernel)."""
        status = getattr(kernel, _ATTRIBUTE, None)
        if status is None:
            status = cls(kernel)
            kernel._publish_status = status.publish
            setattr(kernel, _ATTRIBUTE, status)
        return status

    def uninstall(self) -> None:
        """Give the kernel its own status publishing back."""
        kernel = self._kernel
        if kernel.__dict__.get("_publish_status") == self.publish:
            del kernel._publish_status
        if getattr(kernel, _ATTRIBUTE, None) is self:
            delattr(kernel, _ATTRIBUTE)

    def publish(self, status: str, channel: str, parent: Any = None) -> None:
        """What ``kernel._publish_status(status, channel, parent)`` does, then, for another
        thread's ``idle`` during the main shell's request, that request's ``busy``."""
        with self._lock:
            main = channel == "shell" and threading.current_thread() is self._main
            if main:
                self._running = ((parent or self._kernel.get_parent("shell"))
                                 if status == "busy" else None)
            self._publish(status, channel, parent)
            if not main and status == "idle" and self._running is not None:
                self._publish("busy", "shell", self._running)
