"""An IPython kernel without subshells (as before JEP 91), for the fallback path's tests.

It is ipykernel's own kernel with the shell-channel thread left out: every shell message,
comm messages included, waits on the main thread, as in kernels older than ipykernel 7.

Example::

    python -m nosubshell_kernel -f CONNECTION_FILE
"""

from ipykernel.kernelapp import IPKernelApp


class NoSubshellKernelApp(IPKernelApp):
    """ipykernel with ``supported_features`` lacking "kernel subshells"."""

    def init_sockets(self) -> None:
        super().init_sockets()
        self.shell_channel_thread = None


if __name__ == "__main__":
    NoSubshellKernelApp.launch_instance()
