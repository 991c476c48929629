"""``make lab`` opens a working copy of the notebooks, never the tracked ones (no JupyterLab here:
``tests/test_lab.py`` starts it).

The tracked notebooks are the saved examples; a person's runs and JupyterLab's autosave would
write this machine's outputs and live widgets into them.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT / "scripts"))

from notebook_copy import open_copy, working_copy  # noqa: E402
from deadlines import hang_limit


def test_make_lab_opens_the_copy_in_an_ignored_folder():
    line = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT), "lab-command"],
                          check=True, capture_output=True, text=True, timeout=hang_limit(60)).stdout
    argv = shlex.split(line)
    work = argv[argv.index("--work-dir") + 1]
    assert argv[-1] == "notebooks/01-quickstart.ipynb" and not Path(work).is_absolute()
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to ignore the copy from")
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q",
                              f"{work}/01-quickstart.ipynb"], timeout=hang_limit(60))
    assert ignored.returncode == 0, f"{work}/ is not ignored by git"


def test_the_copy_has_every_notebook_without_the_saved_outputs(tmp_path):
    tracked = {p: p.read_bytes() for p in NOTEBOOKS.glob("*.ipynb")}
    argv = open_copy(["--work-dir", str(tmp_path / "work"), str(NOTEBOOKS / "01-quickstart.ipynb"),
                      "--no-browser"])
    assert argv == [str(tmp_path / "work" / "01-quickstart.ipynb"), "--no-browser"]
    for path in tracked:
        copy = nbformat.read(tmp_path / "work" / path.name, as_version=4)
        nbformat.validate(copy)
        saved = nbformat.read(path, as_version=4)
        assert [c.source for c in copy.cells] == [c.source for c in saved.cells]
        assert not [c for c in copy.cells if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert {p: p.read_bytes() for p in NOTEBOOKS.glob("*.ipynb")} == tracked  # untouched


def test_a_second_make_lab_keeps_the_persons_edits(tmp_path):
    work = tmp_path / "work"
    working_copy(NOTEBOOKS, work)
    edited = work / "01-quickstart.ipynb"
    notebook = json.loads(edited.read_text())
    notebook["cells"][0]["source"] = "my notes"
    edited.write_text(json.dumps(notebook))
    (work / "02-learning-networks.ipynb").unlink()
    copied = working_copy(NOTEBOOKS, work)
    assert copied == [work / "02-learning-networks.ipynb"]  # only what the copy lacked
    assert json.loads(edited.read_text())["cells"][0]["source"] == "my notes"


def test_the_copy_has_only_the_notebooks_not_the_folders_scripts(tmp_path):
    working_copy(NOTEBOOKS, tmp_path / "work")
    scripts = sorted(p.name for p in NOTEBOOKS.glob("*.py"))
    assert scripts  # _build.py, _execute.py, demo.py: the project's, not the person's
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == sorted(
        p.name for p in NOTEBOOKS.glob("*.ipynb"))
