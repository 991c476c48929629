"""Real JupyterLab in Debian's headless Chromium, for the panel's browser tests.

``lab_server`` starts ``jupyter lab`` on a free loopback port with a temporary root, token and
settings (so no earlier workspace or news prompt leaks in) and kills its whole process tree,
kernels included, at the end.  ``lab_page`` is a Playwright page in ``/usr/bin/chromium``; the
tests skip, saying why, only when that browser is missing (``make chromium`` installs it).

Example::

    from browser_support import lab_page, lab_server, open_notebook, open_panel  # noqa: F401

    def test_panel(lab_server, lab_page, tmp_path):
        write_notebook(lab_server.root / "a.ipynb", ["%load_ext phalanx"])
        open_notebook(lab_page, lab_server, "a.ipynb")
        open_panel(lab_page)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil
import pytest

CHROMIUM = os.environ.get("PHALANX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
START_TIMEOUT_S = 60


@dataclass
class LabServer:
    """A running ``jupyter lab``: where it serves, its token and its notebook root."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen

    def lab_url(self, path: str = "") -> str:
        # ?reset: start from an empty workspace, not the layout an earlier test left behind
        # (a restored notebook could otherwise become the active one).
        tree = f"/tree/{path}" if path else ""
        return f"{self.url}/lab{tree}?reset&token={self.token}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet_settings(settings: Path) -> None:
    # The first launch asks whether to fetch news: a toast over the panel in every screenshot.
    target = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def _wait_until_up(url: str, token: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"jupyter lab did not answer within {START_TIMEOUT_S} s:\n{log.read_text()}")


def _kill_tree(process: subprocess.Popen) -> None:
    """Stop the server and every kernel it started; nothing may outlive the test session."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=10)


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory) -> Iterator[LabServer]:
    """``jupyter lab`` on 127.0.0.1 with a throwaway root, token, config and settings."""
    base = tmp_path_factory.mktemp("lab")
    root, settings = base / "root", base / "settings"
    root.mkdir()
    _quiet_settings(settings)
    port, token = _free_port(), "phalanx-test-token"
    env = dict(os.environ,
               JUPYTER_CONFIG_DIR=str(base / "config"),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"))
    log = base / "server.log"
    # expose_app_in_browser gives tests window.jupyterapp to run commands and read kernel state.
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--ServerApp.port_retries=0", "--LabApp.expose_app_in_browser=True"]
    if os.geteuid() == 0:  # CI containers run as root
        argv.append("--allow-root")
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
    server = LabServer(f"http://127.0.0.1:{port}", token, root, process)
    try:
        _wait_until_up(server.url, token, process, log)
        yield server
    finally:
        _kill_tree(process)


@pytest.fixture
def lab_page(lab_server) -> Iterator:
    """A fresh Chromium page (its own context: no state shared between tests)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (make chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


# --- helpers ------------------------------------------------------------------------------------


def write_notebook(path: Path, sources: list[str]) -> Path:
    """Write a notebook of code cells (run later with :func:`run_all_cells`)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, str(path))
    return path


def open_notebook(page, server: LabServer, name: str) -> None:
    """Open ``name`` in JupyterLab and wait until its kernel is idle."""
    page.goto(server.lab_url(name))
    _wait_current(page, name)
    wait_for_kernel_idle(page)


def open_document(page, name: str) -> None:
    """Open (or switch to) ``name`` in the running JupyterLab and wait for its kernel."""
    execute_command(page, "docmanager:open", {"path": name})
    _wait_current(page, name)
    wait_for_kernel_idle(page)


def _wait_current(page, name: str) -> None:
    page.wait_for_function(
        """name => {
            const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            return w && w.context && w.context.path === name;
        }""", arg=name)


def wait_for_kernel_idle(page, timeout_ms: int = 60_000) -> None:
    page.wait_for_function(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            const kernel = w && w.sessionContext && w.sessionContext.session
                && w.sessionContext.session.kernel;
            return kernel && kernel.status === 'idle' && kernel.connectionStatus === 'connected';
        }""", timeout=timeout_ms)


def execute_command(page, command: str, args: dict | None = None) -> None:
    """Start a JupyterLab command (``notebook:run-all-cells``, ``docmanager:open``...).

    Returns without awaiting the command's promise (``docmanager:open`` on an open document
    settles seconds later): callers wait for what they need to see instead.
    """
    page.evaluate("([c, a]) => { window.jupyterapp.commands.execute(c, a); }",
                  [command, args or {}])


def run_all_cells(page) -> None:
    """Run every cell of the current notebook and wait for the kernel to go idle again."""
    execute_command(page, "notebook:run-all-cells")
    # Every prompt of this notebook shows an execution count: "[*]" means still queued.
    page.wait_for_function(
        """() => [...window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-InputPrompt')]
                 .every(p => /\\[\\d+\\]/.test(p.textContent))""", timeout=60_000)
    wait_for_kernel_idle(page)


def open_panel(page):
    """Show the phalanx side panel and return its locator."""
    execute_command(page, "phalanx:open-panel")
    panel = page.locator("#phalanx")
    panel.wait_for(state="visible")
    return panel


def widen_right_sidebar(page, pixels: int) -> None:
    """Drag the split handle left of the right sidebar, as a person would to see more."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x - pixels, y, steps=5)
    page.mouse.up()


def screenshot(page, name: str) -> Path:
    """Save a full-page screenshot under ``test-artifacts/`` (kept by CI as an artifact)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path
