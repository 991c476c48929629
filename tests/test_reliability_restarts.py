"""No leaks across kernel lifetimes (issue 12): one real kernel (jupyter_client) restarted ten
times with phalanx loaded, a cluster started and runs done in some lifetimes, ended in every way
a kernel ends - a restart request, SIGTERM, SIGKILL.  Afterwards nothing of any lifetime is left:
no file or directory in the kernels' temporary directory (torch's per-user compile cache aside),
no shared-memory segment of their runs, no process.
"""

from __future__ import annotations

import getpass
import os
import signal
import time

import psutil
import pytest
from phalanx.cluster._procs import wait_processes_gone

from test_reliability_helpers import alive, figures, shm_segments_of, wait_for  # noqa: F401
from test_reliability_lifecycle import _start_kernel, execute
from deadlines import hang_limit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LIFETIMES = 7  # each way of ending, with work and without, once; plain restarts between
RUN = "%%distributed_fit --no-widget\nfrom phalanx import allreduce\nallreduce(1.0)\n"
NETWORK = """
import numpy as np
from phalanx.network import machine, source
from sklearn.linear_model import Ridge
X, y = source(np.arange(20.0).reshape(10, 2), name="X"), source(np.arange(10.0), name="y")
yhat = machine(Ridge(), X, y, name="ridge").predict(X)
"""
# lifetime -> (what runs in it, how it ends); the others load phalanx and end by a restart request
PLAN = {0: ("run+network", "restart"), 2: ("", "sigkill"), 4: ("run", "sigterm"),
        6: ("run", "sigkill")}


def _end(km, how: str) -> None:
    if how == "sigterm":  # what a kernel manager sends a kernel slow to stop
        kernel = psutil.Process(km.provisioner.pid)
        kernel.send_signal(signal.SIGTERM)
        kernel.wait(timeout=hang_limit(30))
    km.restart_kernel(now=how != "restart")  # now=True: SIGKILL, no clean-up can run


@pytest.mark.timeout(900)  # seven kernel starts, three clusters, on a loaded 2-core machine
def test_kernel_lifetimes_ended_every_way_leave_nothing_behind(tmp_path, figures):
    tmp = tmp_path / ("tmp" * 20)  # deeper than the 107 bytes of a Unix socket's address hold
    tmp.mkdir()
    km, client = _start_kernel({"TMPDIR": str(tmp)})  # everything temporary lands in tmp
    processes: list = []
    started = time.monotonic()
    try:
        for lifetime in range(LIFETIMES):
            work, how = PLAN.get(lifetime, ("", "restart"))
            execute(client, "%load_ext phalanx\nfrom phalanx import get_session\n")
            if work:
                execute(client, "%cluster start -n 2 --gpus none\n")
                execute(client, RUN)
                # The fork server's socket path in this TMPDIR is longer than a Unix address
                # holds: it must serve the engines all the same.
                forked = execute(client, "print(len(get_session().cluster.process_ids()"
                                         "['zygote']))\n")
                assert int(forked) >= 3, "no fork server: each engine imported torch itself"
            if "network" in work:
                execute(client, NETWORK + "\n%distributed_fit yhat\n")
            processes += psutil.Process(km.provisioner.pid).children(recursive=True)
            _end(km, how)
            client.wait_for_ready(timeout=hang_limit(60))
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=False)
    left = wait_processes_gone(processes, 30)  # zombies count as gone
    for proc in left:  # never leave anything behind, even when the test fails
        proc.kill()
    figures["12_kernel_lifetimes"] = LIFETIMES
    figures["12_kernel_lifetimes_s"] = round(time.monotonic() - started, 1)
    assert not alive(left), [" ".join(p.cmdline()[:3]) for p in left if p.is_running()]
    # torch's per-user compile cache (made when an engine's warm-up imports torch._dynamo) is
    # shared by every process of the user and meant to outlive them: not a kernel's leftover
    cache = f"torchinductor_{getpass.getuser()}"
    leftovers = sorted(n for n in os.listdir(tmp) if n != cache)
    assert leftovers == [], leftovers
    assert shm_segments_of({p.pid for p in processes}) == []

