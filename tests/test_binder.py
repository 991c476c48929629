"""Replay Binder's build in a fresh virtual environment: binder/postBuild installs phalanx, the
prebuilt panel is listed as enabled and OK, and the quickstart notebook executes there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest
from deadlines import hang_limit

# An install into a fresh environment, like the wheel test: run by `make test-dist` (CI), not
# by `make test`, whose 15 minutes it would take 1.5 of.
pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is needed to build the lab extension")
def test_binder_steps_give_a_working_lab_and_quickstart(tmp_path):
    env_dir = tmp_path / "binder-env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    _give_pip(env_dir)
    bin_dir = env_dir / "bin"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": str(env_dir), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           # Binder downloads the CPU wheel from PyTorch's index; here the local CPU build stands in.
           "PHALANX_TORCH_INSTALL": "torch==2.13.0"}
    env.pop("PYTHONPATH", None)  # nothing from this checkout leaks in: only what postBuild installed
    # pip compiles every module of every package it installs (about 100 s of CPU here, torch
    # alone 29 s); the replay leaves that to Python, which compiles the few modules that are
    # imported on first use and keeps them for the next process.  What is installed is the same.
    env["PIP_COMPILE"] = "0"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    source = tmp_path / "repo"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", "node_modules", ".git", "test-artifacts", "executed", "__pycache__", "lib",
        "labextension", "*.tsbuildinfo"))
    shutil.copytree(ROOT / "labextension", source / "labextension",
                    ignore=shutil.ignore_patterns("node_modules", "lib", "*.tsbuildinfo"))
    _seed_node_modules(source / "labextension")
    build = subprocess.run(["bash", str(source / "binder" / "postBuild")], cwd=source, env=env,
                           capture_output=True, text=True, timeout=hang_limit(1500))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    # postBuild ends by printing `jupyter labextension list` (and fails without the panel)
    listing = next((line for line in build.stdout.splitlines() if "phalanx-lab" in line), "")
    assert "enabled" in listing and "OK" in listing, build.stdout[-3000:]
    # The notebook driver is the test's, not part of what Binder needs (JupyterLab's server
    # brings it today, through nbconvert: then nothing is installed).
    python = str(bin_dir / "python")
    if subprocess.run([python, "-c", "import nbclient"], env=env, capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "nbclient"], env=env,
                       check=True, capture_output=True, timeout=hang_limit(300))
    demo = subprocess.run([python, str(source / "notebooks" / "demo.py")],
                          cwd=source, env=env, capture_output=True, text=True, timeout=hang_limit(900))
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "test accuracy:" in demo.stdout
    where = subprocess.run([python, "-c", "import phalanx; print(phalanx.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=hang_limit(60))
    assert str(env_dir) in where.stdout  # the installed package, not this checkout


def _give_pip(env_dir: Path) -> None:
    """Binder's image has pip; give the new environment this one's, as hard links.  ``venv``'s
    own way (ensurepip installs its bundled pip and compiles it) costs about 6 s of CPU here for
    the same files."""
    import pip

    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(env_dir)}))
    package = Path(pip.__file__).parent
    for src in (package, *package.parent.glob(f"pip-{pip.__version__}.dist-info")):
        _link_tree(src, purelib / src.name)


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a folder as hard links (a copy where the file system cannot link), without caches."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:  # another file system: a copy does the same
            shutil.copy2(src, dst)

    shutil.copytree(src, dst, symlinks=True, copy_function=link,
                    ignore=shutil.ignore_patterns("__pycache__"))


def _seed_node_modules(labextension: Path) -> None:
    """Give the replay this checkout's installed node packages, as hard links, as a warm yarn
    cache would: Binder's build still runs ``jlpm install`` against the lock file and builds
    the panel from source, but does not copy some 30,000 files again (about 30 s of the
    replay).  Installing them from the lock file on a clean machine is what ``make setup`` does
    at the start of every CI run."""
    installed = ROOT / "labextension" / "node_modules"
    if not installed.is_dir():
        return  # the replay installs them itself
    _link_tree(installed, labextension / "node_modules")
