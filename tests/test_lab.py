"""``make lab``'s own command line starts a JupyterLab that serves the phalanx panel.

The command is read from the Makefile (``make -s lab-command``), so the test runs what ``make lab``
runs, without its install step.  It runs as the current user and, when that is root (containers),
also as an unprivileged user: the README's first command must work for both.  Each run waits for
the printed address, fetches the lab page and the panel's code from it on loopback, checks that
the server listens on loopback only, stops it with Ctrl-C as the banner says, and checks that no
process is left.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
from phalanx.cluster._procs import wait_processes_gone
from deadlines import hang_limit

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120  # JupyterLab starts in seconds; a loaded 2-core machine can take much longer
STOP_TIMEOUT_S = 30
URL = re.compile(r"^\s+(http://\S+)$", re.M)
UNPRIVILEGED = 65534  # "nobody" on Debian and most Linux systems


def lab_command(work_dir: Path) -> list[str]:
    """The line ``make lab`` runs after its install step, with this interpreter as Python and
    its working copy of the notebooks in ``work_dir``."""
    line = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT), "lab-command",
                           f"PY={sys.executable}", f"LAB_DIR={work_dir}"],
                          check=True, capture_output=True, text=True, timeout=hang_limit(60)).stdout
    return shlex.split(line.strip())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _private_dirs(base: Path) -> dict[str, str]:
    """Jupyter's config, runtime and settings in ``base``: nothing read from or left in $HOME."""
    dirs = {"HOME": "home", "JUPYTER_CONFIG_DIR": "config", "JUPYTER_DATA_DIR": "data",
            "JUPYTER_RUNTIME_DIR": "runtime", "JUPYTERLAB_SETTINGS_DIR": "settings",
            "JUPYTERLAB_WORKSPACES_DIR": "workspaces", "IPYTHONDIR": "ipython"}
    env = {}
    for variable, name in dirs.items():
        (base / name).mkdir(parents=True, exist_ok=True)
        env[variable] = str(base / name)
    # JUPYTER_DATA_DIR moves the user's data dir only: the venv's labextensions stay visible.
    return env


def _wait_for_url(process: subprocess.Popen, stdout: Path, stderr: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = URL.search(stdout.read_text())
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise AssertionError(f"make lab's command exited with {process.returncode}:\n"
                                 f"{stdout.read_text()}\n{stderr.read_text()[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no address printed within {START_TIMEOUT_S} s:\n{stderr.read_text()[-4000:]}")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=hang_limit(30)) as response:
        assert response.status == 200, url
        return response.read()


def _assert_serves_the_panel(url: str) -> None:
    """The printed address opens the lab, whose page loads phalanx's panel from this server."""
    parts = urlsplit(url)
    page = _get(url).decode()
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                  page, re.S).group(1))
    panel = [e for e in config["federated_extensions"] if e["name"] == "phalanx-lab"]
    assert panel, [e["name"] for e in config["federated_extensions"]]
    code = _get(f"{parts.scheme}://{parts.netloc}{config['fullLabextensionsUrl']}/phalanx-lab/{panel[0]['load']}")
    assert b"phalanx-lab" in code


def _listening_addresses(process: psutil.Process) -> set[str]:
    return {c.laddr.ip for c in process.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def _stop_like_ctrl_c(process: subprocess.Popen) -> list[psutil.Process]:
    """Ctrl-C, as the banner says; returns every process of the run that is still alive after."""
    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    os.killpg(process.pid, signal.SIGINT)  # a terminal sends Ctrl-C to the whole foreground group
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    finally:
        alive = wait_processes_gone(tree, 5)  # zombies count as gone
        for survivor in alive:
            survivor.kill()
    return alive


def run_lab(base: Path, user_prefix: list[str]) -> None:
    port = _free_port()
    argv = [*user_prefix, *lab_command(base / "work"), "--no-browser", f"--port={port}",
            "--ServerApp.port_retries=0"]
    env = {**os.environ, **_private_dirs(base)}
    stdout, stderr = base / "stdout.txt", base / "stderr.txt"
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=err,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        url = _wait_for_url(process, stdout, stderr)
        assert url.startswith(f"http://127.0.0.1:{port}/lab/tree/01-quickstart.ipynb?token="), url
        assert (base / "work" / "01-quickstart.ipynb").is_file()  # the copy, not the tracked one
        _assert_serves_the_panel(url)
        server = psutil.Process(process.pid)
        assert _listening_addresses(server) <= {"127.0.0.1", "::1"}, _listening_addresses(server)
        assert "Ctrl-C" in stdout.read_text()
    finally:
        if process.poll() is None:
            left = _stop_like_ctrl_c(process)
            assert not left, f"still running after Ctrl-C: {[p.cmdline() for p in left]}"
    assert process.returncode == 0, stderr.read_text()[-4000:]
    assert "Running as root" not in stderr.read_text()


def test_make_lab_command_runs_as_the_current_user(tmp_path):
    run_lab(tmp_path, [])


@pytest.mark.skipif(os.geteuid() != 0, reason="not root: the current-user test is the normal user's")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to drop root")
def test_make_lab_command_runs_as_a_normal_user_too():
    base = Path(tempfile.mkdtemp(prefix="phalanx-lab-"))  # not under root's private tmp dir
    try:
        os.chmod(base, 0o755)
        os.chown(base, UNPRIVILEGED, UNPRIVILEGED)
        _private_dirs(base)
        for path in base.iterdir():
            os.chown(path, UNPRIVILEGED, UNPRIVILEGED)
        run_lab(base, ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}",
                       "--clear-groups", "--"])
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_allow_root_only_for_root():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from lab import lab_argv
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert lab_argv(["a.ipynb"], uid=0) == ["a.ipynb", "--allow-root"]
    assert lab_argv(["a.ipynb", "--allow-root"], uid=0) == ["a.ipynb", "--allow-root"]
    assert lab_argv(["a.ipynb"], uid=1000) == ["a.ipynb"]
