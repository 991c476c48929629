"""phalanx as a user installs it: the wheel from dist/ (``make dist``) goes into a new virtual
environment with pip, beside JupyterLab, and a quickstart runs there in JupyterLab, in headless
Chromium, with the phalanx side panel following the run.

Nothing of this checkout is on the new environment's path: its commands run from a temporary
folder with ``PYTHONPATH`` cleared, and the kernel's phalanx is checked to be the environment's.
pip may fetch the wheel's dependencies from the package index (its own cache is kept); all else
(IPython's and Jupyter's folders, matplotlib's cache) lives in the test's temporary folder.

``make test-dist`` runs the test marked ``dist`` (a few minutes; ``make test`` leaves it out).
The others here are quick checks of the package's metadata and run with the suite.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from browser_support import (
    CHROMIUM,
    StepClock,
    chromium_page,
    open_notebook,
    open_panel,
    run_cell,
    running_lab,
    screenshot,
    screenshot_on_failure,
    start_cell,
    wait_for_kernel_idle,
    write_notebook,
)
from conftest import assert_all_gone
from deadlines import hang_limit

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    (ROOT / "kernel_ext" / "phalanx" / "_version.py").read_text(), re.M).group(1)
TORCH = "torch==2.13.0"  # first, pinned: pip then keeps this CPU build for the wheel's torch>=2.4
PIP_TIMEOUT_S = 600
STEPS = 40

QUICKSTART = [
    # 0
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    # 1: long enough (about 4 s) for the panel to show it running
    f"""%%distributed_fit --steps {STEPS} --name quickstart --seed 0
import time, torch, phalanx
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.03)
for _ in range({STEPS}):
    x = torch.randn(16, 3)
    opt.zero_grad()
    loss = ((net(x) - x.sum(1, keepdim=True)) ** 2).mean()
    loss.backward()
    opt.step()
    phalanx.log(loss=loss.item())
    time.sleep(0.1)""",
    # 2
    "import json, phalanx\n"
    "print(json.dumps({'version': phalanx.__version__, 'file': phalanx.__file__,\n"
    "                  'pids': phalanx.get_session().cluster.process_ids()}))",
    # 3
    "%cluster stop",
]
LOAD_CLUSTER, FIT, FACTS, STOP = range(4)
CLUSTER_TIMEOUT_MS = 180_000


def test_every_project_address_is_a_page_of_the_repository():
    """Documentation, Changelog and Issues derive from the one ``Repository`` address."""
    urls = PYPROJECT["project"]["urls"]
    repository = urls["Repository"]
    assert {"Documentation", "Changelog", "Issues"} <= set(urls)
    for name, url in urls.items():
        assert url == repository or url.startswith((f"{repository}/", f"{repository}#")), name


def test_the_changelog_opens_with_this_version():
    """The version is written once (_version.py) and the changelog's first release is it."""
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "kernel_ext/phalanx/_version.py"
    releases = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0] == VERSION, releases
    # `jupyter labextension list` shows the panel's own version: the same release
    panel = json.loads((ROOT / "labextension" / "package.json").read_text())
    assert panel["version"] == VERSION, "bump labextension/package.json with _version.py"


def test_the_all_extra_is_every_user_extra():
    """``phalanx[all]`` installs every extra but the one for working on phalanx (``test``)."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    (everything,) = extras["all"]
    named = re.fullmatch(r"phalanx\[([\w,-]+)\]", everything).group(1).split(",")
    assert sorted(named) == sorted(set(extras) - {"all", "test"})


@pytest.mark.dist
@pytest.mark.timeout(900)
def test_the_wheel_installs_with_pip_and_runs_a_quickstart_in_jupyterlab(tmp_path,
                                                                         tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium (make chromium)")
    wheel = _wheel()
    step = StepClock()
    env_dir, work = tmp_path / "env", tmp_path / "work"
    work.mkdir()
    env = _user_environment(env_dir, tmp_path)
    python = str(env_dir / "bin" / "python")
    _run([sys.executable, "-m", "venv", str(env_dir)], work, env)
    _run([python, "-m", "pip", "install", "-q", TORCH], work, env, PIP_TIMEOUT_S)
    step("new environment with torch")
    _run([python, "-m", "pip", "install", "-q", "jupyterlab", str(wheel)], work, env, PIP_TIMEOUT_S)
    step("jupyterlab and the wheel installed")

    installed = json.loads(_run(
        [python, "-c", "import json, phalanx; "
                       "print(json.dumps([phalanx.__version__, phalanx.__file__]))"], work, env))
    assert installed[0] == VERSION
    assert Path(installed[1]).is_relative_to(env_dir), installed  # not this checkout
    # JupyterLab writes the listing through its log, to stderr
    _assert_listed_prebuilt(_run([str(env_dir / "bin" / "jupyter"), "labextension", "list"],
                                 work, env, both=True), env_dir)

    # a short base: the kernels' Unix sockets live under it (at most 107 bytes a path)
    with running_lab(tmp_path_factory.mktemp("lab"), python=python, environ=env) as server:
        step("jupyter lab up")
        write_notebook(server.root / "quickstart.ipynb", QUICKSTART)
        with chromium_page() as page, screenshot_on_failure(page, "wheel-install-failure.png"):
            open_notebook(page, server, "quickstart.ipynb")
            panel = open_panel(page)
            run_cell(page, LOAD_CLUSTER, timeout_ms=CLUSTER_TIMEOUT_MS)
            panel.locator(".jp-Phalanx-status").filter(has_text="live").wait_for()
            panel.locator(".jp-Phalanx-cluster tbody tr").nth(1).wait_for()
            assert panel.locator(".jp-Phalanx-cluster tbody tr").count() == 2
            step("cluster of 2 engines started, shown in the panel")
            _train_and_follow(page, panel)
            step("quickstart run followed in the cell and the panel")
            facts = json.loads(run_cell(page, FACTS))
            assert facts["version"] == VERSION and Path(facts["file"]).is_relative_to(env_dir)
            cluster = facts["pids"]["controller"] + facts["pids"]["engines"] + facts["pids"]["warden"]
            assert len(facts["pids"]["engines"]) >= 2, facts
            screenshot(page, "wheel-install-quickstart.png")
            run_cell(page, STOP)
            panel.locator(".jp-Phalanx-cluster").filter(has_text="No cluster").wait_for()
            assert_all_gone(cluster, timeout=hang_limit(30))  # no engine, nanny, controller or watchdog left
            step("cluster stopped, none of its processes left")
    # running_lab has failed by now if any process of the kernel outlived the server
    assert_all_gone(facts["pids"]["zygote"], timeout=hang_limit(30))
    step("lab stopped, nothing left")


def _train_and_follow(page, panel) -> None:
    """The run as a person sees it: the panel follows it while it trains and shows it done; the
    cell shows a bar per rank and keeps the run's summary with its curves."""
    start_cell(page, FIT)
    running = panel.locator("section[aria-label='Run'][data-status='running']")
    running.wait_for(timeout=CLUSTER_TIMEOUT_MS)
    assert "quickstart" in running.inner_text()
    panel.locator("section[aria-label='Run'][data-status='done']").wait_for(
        timeout=CLUSTER_TIMEOUT_MS)
    steps = dict(panel.locator(".jp-Phalanx-rank").evaluate_all(
        "ranks => ranks.map(r => [r.dataset.rank, r.dataset.step])"))
    assert steps == {"0": str(STEPS), "1": str(STEPS)}
    assert panel.locator(".jp-Phalanx-metric").input_value() == "loss"
    assert int(panel.locator(".jp-Phalanx-chart").get_attribute("data-points")) == STEPS
    output = page.locator(".jp-Notebook .jp-Cell").nth(FIT).locator(".jp-OutputArea")
    # the summary in the live view's place once the run ended: what a saved notebook shows
    summary = output.locator('img[alt="metric curves of quickstart"]')
    summary.wait_for(state="attached", timeout=hang_limit(60_000))
    assert summary.evaluate("img => img.naturalWidth") > 100
    wait_for_kernel_idle(page)
    text = output.inner_text()
    assert "quickstart" in text and "done" in text, text
    assert all(f"{rank}\t{STEPS}\t" in text for rank in (0, 1)), text  # each rank's steps
    assert output.locator(".widget-hprogress").count() == 0  # the live view made way for it
    assert output.locator(".jupyter-widgets-error-widget").count() == 0


def _wheel() -> Path:
    wheel = ROOT / "dist" / f"phalanx-{VERSION}-py3-none-any.whl"
    assert wheel.is_file(), f"no {wheel.relative_to(ROOT)}: build it with `make dist`"
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    panel = f"phalanx-{VERSION}.data/data/share/jupyter/labextensions/phalanx-lab/"
    for part in ("package.json", "install.json", "static/style.js"):
        assert panel + part in names, f"the wheel lacks the panel's {part}"
    return wheel


def _user_environment(env_dir: Path, tmp: Path) -> dict[str, str]:
    """The environment of a person who activated the new virtual environment: this checkout's
    folders are off PATH and PYTHONPATH, and IPython's, Jupyter's and matplotlib's folders are
    new ones in ``tmp``."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV",
            "JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_PLATFORM_DIRS"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(ROOT)]
    env.update(PATH=os.pathsep.join([str(env_dir / "bin"), *path]), VIRTUAL_ENV=str(env_dir),
               IPYTHONDIR=str(tmp / "ipython"), JUPYTER_DATA_DIR=str(tmp / "jupyter-data"),
               JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"), MPLCONFIGDIR=str(tmp / "mpl"),
               PIP_DISABLE_PIP_VERSION_CHECK="1",
               # pip would compile every module it installs (over a minute of CPU here); Python
               # compiles the few that are imported, on first use, and keeps them
               PIP_COMPILE="0")
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = hang_limit(120),
         both: bool = False) -> str:
    """``argv``'s standard output (and error, with ``both``); fails the test if it fails."""
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr if both else done.stdout


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _assert_listed_prebuilt(listing: str, env_dir: Path) -> None:
    """``jupyter labextension list`` names phalanx-lab enabled and OK in the environment's own
    folder of prebuilt extensions, installed by the phalanx package."""
    folder, found = None, None
    for line in _ANSI.sub("", listing).splitlines():
        if line and not line[0].isspace():
            folder = line.strip()
        elif line.split()[:1] == ["phalanx-lab"]:
            found = (folder, line.split())
    assert found, listing
    folder, words = found
    assert folder == str(env_dir / "share" / "jupyter" / "labextensions"), listing
    assert "enabled" in words and "OK" in words and "(python, phalanx)" in " ".join(words), listing
