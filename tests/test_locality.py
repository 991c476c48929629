"""Same host or not: a machine identity, never an address that starts with 127."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from phalanx.cluster._launchers import CURVE_ARG, LaunchOptions, make_launcher
from phalanx.cluster._locality import host_label, is_local, is_loopback, machine_identity
from deadlines import hang_limit

PROBE = ("import json; from phalanx.cluster._probe import identify_engine; "
         "print(json.dumps(identify_engine('127.0.0.1')))")


def _probe(prefix: list[str] = ()) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([*prefix, sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, check=True, timeout=hang_limit(60)).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_another_process_on_this_host_is_local():
    info = _probe()
    assert info["machine"] == machine_identity() and is_local(info)


def test_an_engine_in_another_network_namespace_is_not_local_even_on_loopback():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to run a process in a new network namespace")
    # Its hostname is ours and it answers from 127.0.0.1 - exactly what fooled the old check.
    info = _probe(["unshare", "--net"])
    assert info["address"].startswith("127.") and info["host"] == os.uname().nodename
    assert not is_local(info)
    assert host_label(info) == info["address"]  # shown apart from the kernel's own host


def test_an_engine_without_an_identity_is_not_local():
    assert not is_local({"host": os.uname().nodename, "address": "127.0.1.1"})


@pytest.mark.parametrize("address,loopback", [("127.0.1.1", True), ("tcp://127.0.0.1:5555", True),
                                              ("10.0.0.2", False), ("tcp://192.0.2.2:41", False),
                                              ("::1", True), ("localhost", True)])
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback


def test_encryption_is_on_beyond_loopback_unless_turned_off():
    local = make_launcher("local", LaunchOptions())
    assert local.controller_args("127.0.0.1") == []
    assert local.controller_args("10.0.0.5") == [CURVE_ARG]
    off = make_launcher("ssh", LaunchOptions(hosts="h:1", encrypt=False))
    assert off.controller_args("10.0.0.5") == []
