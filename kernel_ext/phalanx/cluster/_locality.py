"""Whether an engine runs on the kernel's host, and which address reaches it.

"Same host" decides a lot: a private file rendezvous in ``/tmp``, gloo on loopback, shared-memory
collectives, signalling and killing engines by pid.  All of that needs the same running kernel
(boot id), the same network (network namespace: loopback is per namespace) and the same files
(mount namespace: ``/tmp`` and ``/dev/shm``).  An address that starts with ``127.`` proves none of
it: Debian maps every hostname to ``127.0.1.1``, so a remote engine would look local.

This module must stay import-light: :func:`machine_identity` runs inside engines too.

Example::

    >>> machine_identity() == machine_identity()
    True
    >>> route_address("127.0.0.1")
    '127.0.0.1'
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Any


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _namespace(kind: str) -> str:
    try:
        return str(os.stat(f"/proc/self/ns/{kind}").st_ino)
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def machine_identity() -> str:
    """This process's host as the kernel sees it: boot id (else machine id, else hostname),
    network namespace and mount namespace.  Two processes with equal identities share
    loopback, ``/tmp`` and ``/dev/shm``."""
    machine = (_read("/proc/sys/kernel/random/boot_id") or _read("/etc/machine-id")
               or socket.gethostname())
    return f"{machine}/net:{_namespace('net')}/mnt:{_namespace('mnt')}"


def is_local(engine: Any) -> bool:
    """Whether ``engine`` (a slot with ``info``, or the probe's dict) runs on this host."""
    info = engine if isinstance(engine, dict) else getattr(engine, "info", None) or {}
    return bool(info.get("machine")) and info["machine"] == machine_identity()


def is_loopback(address: str) -> bool:
    """Whether ``address`` (``IP``, ``IP:PORT`` or ``tcp://IP:PORT``) is a loopback address."""
    import ipaddress

    host = address.removeprefix("tcp://")
    if host.count(":") == 1:
        host = host.split(":")[0]
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def route_address(peer: str) -> str:
    """This host's address on the route to ``peer`` (a name or an IP; no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((socket.gethostbyname(peer), 9))  # only asks the routing table
        return probe.getsockname()[0]
    finally:
        probe.close()


def host_label(info: dict) -> str:
    """The host name shown for an engine: a remote engine that shares the kernel's hostname
    (a container, a network namespace) is shown by its address instead."""
    host = info.get("host") or ""
    if not is_local(info) and host == socket.gethostname() and info.get("address"):
        return info["address"]
    return host
