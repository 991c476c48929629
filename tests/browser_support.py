"""Real JupyterLab in Debian's headless Chromium, for the panel's browser tests.

``lab_server`` is one ``jupyter lab`` per test worker (``shared_lab`` in conftest.py: starting
one costs some 10 s of a busy machine) on a free loopback port with a temporary root, token and
settings (so no earlier workspace or news prompt leaks in).  At the end of each test module it
shuts down every kernel the module started and fails if any process those kernels started
(engine, controller, scheduler) outlives them; at the end of the session the server stops with
the same check.  ``lab_page`` is a Playwright page in ``/usr/bin/chromium``, a fresh browser per
test; the tests skip, saying why, only when that browser is missing (``make chromium`` installs
it).

Example::

    from browser_support import lab_page, lab_server, open_notebook, open_panel  # noqa: F401

    def test_panel(lab_server, lab_page):
        write_notebook(lab_server.root / "a.ipynb", ["%load_ext phalanx", "print(1 + 1)"])
        open_notebook(lab_page, lab_server, "a.ipynb")
        open_panel(lab_page)
        run_cell(lab_page, 0)
        assert run_cell(lab_page, 1) == "2\n"
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil
import pytest
from phalanx.cluster._procs import wait_processes_gone
from deadlines import hang_limit

CHROMIUM = os.environ.get("PHALANX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
START_TIMEOUT_S = 60
WAIT_POLL_MS = 100  # how often a page's wait_for_function re-checks (see chromium_page)


@dataclass
class LabServer:
    """A running ``jupyter lab``: where it serves, its token and its notebook root."""

    url: str
    token: str
    root: Path
    process: psutil.Process

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


def _wait_until_up(url: str, token: str, process: psutil.Process, log: Path,
                   timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not wait_processes_gone([process], 0):  # it has exited
            raise RuntimeError(f"jupyter lab exited:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"jupyter lab did not answer within {timeout_s} s:\n{log.read_text()}")


def _start_detached(argv: list[str], log: Path, env: dict, cwd: Path) -> psutil.Process:
    """Start ``argv`` through a launcher that exits at once, so that it is not a child of this
    process: a server shared by the test modules of a worker must not show up in the process
    tree of the worker, which other tests search for leftovers of their own."""
    launch = ("import subprocess, sys\n"
              "with open(sys.argv[1], 'w') as out:\n"
              "    print(subprocess.Popen(sys.argv[2:], stdout=out, stderr=subprocess.STDOUT,\n"
              "                           stdin=subprocess.DEVNULL).pid)\n")
    launched = subprocess.run([sys.executable, "-c", launch, str(log), *argv], env=env, cwd=cwd,
                              capture_output=True, text=True, check=True, timeout=hang_limit(60))
    return psutil.Process(int(launched.stdout))


def _kill_tree(process: psutil.Process, grace_s: float = 20.0) -> list[str]:
    """Stop the server; its kernels shut down, and their clusters with them.

    Returns what was still running ``grace_s`` after the server exited (then killed), as
    ``"pid cmdline"`` strings: engines or controllers that outlived their kernel are a bug.
    """
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    with contextlib.suppress(psutil.NoSuchProcess):
        process.terminate()  # jupyter server shuts its kernels down on the way out
    if wait_processes_gone([process], 20):
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
        wait_processes_gone([process], 10)
    return _killed_survivors(wait_processes_gone(children, grace_s))  # zombies count as gone


def _killed_survivors(alive: list) -> list[str]:
    """Kill what is still running and say what it was."""
    survivors = []
    for child in alive:
        try:
            survivors.append(f"{child.pid} {' '.join(child.cmdline())[:160]}")
            child.kill()
        except psutil.NoSuchProcess:
            pass
    wait_processes_gone(alive, 10)
    return survivors


@contextlib.contextmanager
def running_lab(base: Path, start_timeout_s: float = START_TIMEOUT_S,
                python: str = sys.executable, environ: dict | None = None) -> Iterator[LabServer]:
    """``jupyter lab`` on 127.0.0.1 with its root, token, config and settings under ``base``.

    ``python`` is the interpreter whose JupyterLab serves (another environment's, say) and
    ``environ`` the environment it starts from (this process's by default).  Stopped at the end
    with its kernels; raises if any process it started (a kernel, an engine, a controller) is
    still running afterwards.
    """
    root, settings = base / "root", base / "settings"
    root.mkdir()
    _quiet_settings(settings)
    port, token = _free_port(), "phalanx-test-token"
    env = dict(os.environ if environ is None else environ,
               JUPYTER_CONFIG_DIR=str(base / "config"),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"))
    log = base / "server.log"
    # expose_app_in_browser gives tests window.jupyterapp to run commands and read kernel state.
    argv = [python, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--ServerApp.port_retries=0", "--LabApp.expose_app_in_browser=True",
            # kernels on Unix sockets: no TCP port to lose to a parallel test (kernel_support.py)
            "--KernelManager.transport=ipc"]
    if os.geteuid() == 0:  # CI containers run as root
        argv.append("--allow-root")
    process = _start_detached(argv, log, env, root)
    server = LabServer(f"http://127.0.0.1:{port}", token, root, process)
    try:
        _wait_until_up(server.url, token, process, log, start_timeout_s)
        yield server
    finally:
        survivors = _kill_tree(process)
    assert not survivors, f"processes outlived the lab server (now killed): {survivors}"


@contextlib.contextmanager
def chromium_page(width: int = 1400, height: int = 900, scale: float = 1) -> Iterator:
    """A fresh page in headless Chromium (its own context), closed with the browser at the end.

    Its ``wait_for_function`` re-checks the condition every ``WAIT_POLL_MS`` instead of at every
    animation frame (Playwright's default), which keeps Chromium drawing frames for as long as
    a test waits: measured 0.13 s of the browser's CPU per second of waiting, against 0.04 s
    polling every 250 ms and 0.015 s idle."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height},
                                          device_scale_factor=scale)
            page = context.new_page()
            page.set_default_timeout(30_000)
            page.wait_for_function = functools.partial(page.wait_for_function,
                                                       polling=WAIT_POLL_MS)
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def lab_server(shared_lab: LabServer) -> Iterator[LabServer]:
    """The worker's :func:`running_lab`, left with no kernel and no process of theirs when the
    module ends (the check a server of its own would make when it stopped)."""
    yield shared_lab
    survivors = end_kernels(shared_lab)
    assert not survivors, f"processes outlived their kernels (now killed): {survivors}"


def end_kernels(server: LabServer, grace_s: float = 20.0) -> list[str]:
    """Shut down every session and kernel of ``server`` through its REST API, as the server does
    for each kernel when it stops; returns what of theirs still ran ``grace_s`` later (then
    killed), as ``"pid cmdline"`` strings."""
    try:
        started = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    for kind in ("sessions", "kernels"):  # a session's kernel ends with it; then any other
        for item in _api(server, "GET", f"/api/{kind}"):
            _api(server, "DELETE", f"/api/{kind}/{item['id']}")
    return _killed_survivors(wait_processes_gone(started, grace_s))


def _api(server: LabServer, method: str, path: str):
    request = urllib.request.Request(f"{server.url}{path}", method=method,
                                     headers={"Authorization": f"token {server.token}"})
    try:
        with urllib.request.urlopen(request, timeout=hang_limit(60)) as answer:
            body = answer.read()
    except urllib.error.HTTPError as error:
        if error.code == 404:  # ended meanwhile (a session's kernel, listed before its session)
            return []
        raise
    return json.loads(body) if body else []


@pytest.fixture
def lab_page(lab_server) -> Iterator:
    """A fresh Chromium page (its own context: no state shared between tests)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (make chromium)")
    with chromium_page() as page:
        yield page


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


def reload_lab(page) -> None:
    """Reload the page as a person would (F5) and wait until JupyterLab restored its layout."""
    page.reload()
    page.wait_for_function("() => window.jupyterapp")
    page.evaluate("() => window.jupyterapp.restored.then(() => true)")
    wait_for_kernel_idle(page)


def open_document(page, name: str, settle_ms: int = 1000, timeout_s: float = 90) -> None:
    """Open (or switch to) ``name`` in the running JupyterLab and wait for its kernel.

    Shortly after a page load, a notebook restored with the page can take the focus back
    (JupyterLab's focus tracker then makes it current again), so the switch is checked once
    more after ``settle_ms`` and repeated if it did not stick.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        execute_command(page, "docmanager:open", {"path": name})
        _wait_current(page, name)
        wait_for_kernel_idle(page)
        page.wait_for_timeout(settle_ms)
        if page.evaluate(_IS_CURRENT, name):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} did not stay the current document")


_IS_CURRENT = """name => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    return !!(w && w.context && w.context.path === name);
}"""


def _wait_current(page, name: str) -> None:
    page.wait_for_function(_IS_CURRENT, arg=name)


# The notebook a helper acts on: the one open at ``path``, else the current one.  A test with
# two notebooks names them: shortly after a page load the other notebook can take the focus back
# (JupyterLab's focus tracker), and a helper reading ``shell.currentWidget`` would then run or
# read a cell of the wrong notebook.
_NOTEBOOK = """const notebookAt = path => path
    ? [...window.jupyterapp.shell.widgets('main')].find(w => w.context && w.context.path === path)
    : window.jupyterapp.shell.currentWidget;"""


def wait_for_kernel_idle(page, timeout_ms: int = hang_limit(60_000), notebook: str | None = None) -> None:
    page.wait_for_function(
        "path => { " + _NOTEBOOK + """
            const w = notebookAt(path);
            const kernel = w && w.sessionContext && w.sessionContext.session
                && w.sessionContext.session.kernel;
            return kernel && kernel.status === 'idle' && kernel.connectionStatus === 'connected';
        }""", arg=notebook, timeout=timeout_ms)


def execute_command(page, command: str, args: dict | None = None) -> None:
    """Start a JupyterLab command (``notebook:run-all-cells``, ``docmanager:open``...).

    Returns without awaiting the command's promise (``docmanager:open`` on an open document
    settles seconds later): callers wait for what they need to see instead.
    """
    page.evaluate("([c, a]) => { window.jupyterapp.commands.execute(c, a); }",
                  [command, args or {}])


def run_all_cells(page, timeout_ms: int = hang_limit(240_000)) -> None:
    """Run every cell of the current notebook and wait for the kernel to go idle again.

    The wait covers every cell, a cluster start included: minutes on a busy machine.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    execute_command(page, "notebook:run-all-cells")
    try:
        # Every prompt of this notebook shows an execution count: "[*]" means still queued.
        page.wait_for_function(
            """() => [...window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-InputPrompt')]
                     .every(p => /\\[\\d+\\]/.test(p.textContent))""", timeout=timeout_ms)
    except PlaywrightTimeout:
        raise AssertionError(f"run all cells did not finish in {timeout_ms / 1000:.0f} s; "
                             f"cells not done:\n{_unfinished_cells(page)}") from None
    wait_for_kernel_idle(page, timeout_ms)


def _unfinished_cells(page) -> str:
    """Each cell still running or queued: its prompt, its source's first line, its output so
    far (the evidence of where a run-all hung), with a screenshot saved beside."""
    try:
        screenshot(page, "run-all-cells-timeout.png")
        cells = page.evaluate(
            """() => window.jupyterapp.shell.currentWidget.content.widgets.map((cell, i) => ({
                 i, prompt: (cell.node.querySelector('.jp-InputPrompt') || {}).textContent || '',
                 source: cell.model.sharedModel.getSource().split('\\n')[0],
                 output: ((cell.node.querySelector('.jp-OutputArea') || {}).innerText || '')
                         .slice(-600)}))""")
    except Exception as exc:  # the page may be gone: the timeout is still the failure
        return f"(the page could not be read: {exc})"
    return "\n".join(f"cell {c['i']} {c['prompt']} {c['source']!r}: {c['output']!r}"
                     for c in cells if not re.search(r"\[\d+\]", c["prompt"]))


def start_cell(page, index: int, notebook: str | None = None) -> None:
    """Run cell ``index`` without waiting for it (a person keeps using the page).

    With ``notebook``, the cell of that open notebook runs whichever notebook is current
    (``semanticWidget`` names the notebook to JupyterLab's command; ``activate: false`` leaves
    the focus where it is).
    """
    page.evaluate(
        "([i, path]) => { " + _NOTEBOOK + """
            const nb = notebookAt(path);
            nb.content.activeCellIndex = i;
            window.jupyterapp.commands.execute(
                'notebook:run-cell', {semanticWidget: nb.id, activate: false}); }""",
        [index, notebook])


def run_cell(page, index: int, timeout_ms: int = hang_limit(180_000), notebook: str | None = None) -> str:
    """Run cell ``index`` of the current notebook (or of ``notebook``) as a person would;
    return its text output.

    Waits until the cell has a new execution count and the kernel is idle again.  A cell that
    raised fails the test with the kernel's error, so a broken cell is not misread as a broken
    panel.
    """
    before = _cell_field(page, index, notebook, "executionCount")
    start_cell(page, index, notebook)
    page.wait_for_function(
        "([i, before, path]) => { " + _NOTEBOOK + """
            const nb = notebookAt(path);
            const count = nb.content.widgets[i].model.executionCount;
            const kernel = nb.sessionContext.session && nb.sessionContext.session.kernel;
            return count !== null && count !== before && kernel && kernel.status === 'idle';
        }""", arg=[index, before, notebook], timeout=timeout_ms)
    return _output_text(cell_outputs(page, index, notebook))


def cell_outputs(page, index: int, notebook: str | None = None) -> list[dict]:
    """The outputs of cell ``index`` as nbformat JSON (of the current notebook or ``notebook``)."""
    return _cell_field(page, index, notebook, "outputs")


def _cell_field(page, index: int, notebook: str | None, field: str):
    return page.evaluate(
        "([i, path, field]) => { " + _NOTEBOOK + """
            const model = notebookAt(path).content.widgets[i].model;
            return field === 'outputs' ? model.outputs.toJSON() : model[field]; }""",
        [index, notebook, field])


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _output_text(outputs: list[dict]) -> str:
    texts = []
    for out in outputs:
        if out.get("output_type") == "error":
            trace = _ANSI.sub("", "\n".join(out.get("traceback") or []))
            raise AssertionError(f"the cell raised {out.get('ename')}: {out.get('evalue')}\n{trace}")
        if out.get("output_type") == "stream":
            texts.append(_joined(out.get("text", "")))
        elif "text/plain" in (out.get("data") or {}):
            texts.append(_joined(out["data"]["text/plain"]))
    return "".join(texts)


def _joined(text: str | list[str]) -> str:
    return "".join(text) if isinstance(text, list) else text


def training_loop(steps: int, sleep_s: float = 0.05) -> str:
    """The body of a ``%%distributed_fit`` cell that trains a tiny model for ``steps`` steps,
    sleeping ``sleep_s`` each: long enough to act on while it runs, cheap on a busy machine."""
    return f"""import time, torch
from phalanx import log
from phalanx.runtime import steps
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.03)
for step in steps({steps}):
    x = torch.randn(16, 3)
    opt.zero_grad()
    loss = ((net(x) - x.sum(1, keepdim=True)) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
    time.sleep({sleep_s})"""


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


@contextlib.contextmanager
def screenshot_on_failure(page, name: str) -> Iterator[None]:
    """Save a screenshot as ``name`` when the block fails: what the page showed is the evidence."""
    try:
        yield
    except BaseException:
        try:
            screenshot(page, name)
        except Exception:  # the page may be gone; the original error matters more
            pass
        raise


class StepClock:
    """Prints how long each step of a long browser test took (shown when the test fails)."""

    def __init__(self) -> None:
        self._start = self._last = time.monotonic()

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        print(f"[{now - self._start:6.1f} s] +{now - self._last:5.1f} s  {step}")
        self._last = now


def screenshot(page, name: str) -> Path:
    """Save a full-page screenshot under ``test-artifacts/`` (kept by CI as an artifact)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    return path
