"""The notebooks ``make lab`` opens: a working copy of ``notebooks/``, outside the tracked files.

The tracked notebooks are the saved, executed examples (``tests/test_notebooks_saved.py`` checks
them); what a person runs, edits and JupyterLab autosaves (live widgets, this machine's hosts and
timings) belongs in a copy git ignores.  A file is copied only where the copy lacks it, so edits
survive the next ``make lab`` and a notebook added upstream still arrives.  Copied notebooks
start without outputs: the saved ones were made on another machine.

    python scripts/notebook_copy.py notebooks lab-notebooks
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SKIPPED = ("__pycache__",)  # and every dot-name: .ipynb_checkpoints, editors' files


def working_copy(source: Path, target: Path) -> list[Path]:
    """Copy into ``target`` each notebook of ``source`` it lacks; the files copied (in
    ``target``).  Only notebooks: the folder's scripts (``_build.py``, ``demo.py``) are the
    project's, not something to open in the lab.

    >>> import tempfile
    >>> base = Path(tempfile.mkdtemp())
    >>> (base / "nb").mkdir(); _ = (base / "nb" / "a.ipynb").write_text('{"cells": []}')
    >>> _ = (base / "nb" / "_build.py").write_text("x = 1")
    >>> [p.name for p in working_copy(base / "nb", base / "work")]
    ['a.ipynb']
    >>> working_copy(base / "nb", base / "work")   # nothing is copied twice
    []
    """
    copied = []
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if (not path.is_file() or path.suffix != ".ipynb"
                or any(p.startswith(".") or p in SKIPPED for p in relative.parts)):
            continue
        destination = target / relative
        if destination.exists():
            continue  # the person's copy, perhaps edited: never overwritten
        destination.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".ipynb":
            destination.write_text(_without_outputs(path.read_text(encoding="utf-8")), encoding="utf-8")
        else:
            shutil.copy2(path, destination)
        copied.append(destination)
    return copied


def _without_outputs(text: str) -> str:
    notebook = json.loads(text)
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    notebook.get("metadata", {}).pop("widgets", None)
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def open_copy(args: list[str]) -> list[str]:
    """``jupyter lab`` arguments with ``--work-dir DIR`` taken out and each notebook named
    replaced by its copy in DIR (made first: :func:`working_copy` of the notebook's folder).

    >>> open_copy(["nb/a.ipynb", "--no-browser"])   # no --work-dir: unchanged
    ['nb/a.ipynb', '--no-browser']
    """
    if "--work-dir" not in args:
        return list(args)
    at = args.index("--work-dir")
    target, rest = Path(args[at + 1]), args[:at] + args[at + 2:]
    opened = []
    for arg in rest:
        if arg.endswith(".ipynb") and not arg.startswith("-"):
            notebook = Path(arg)
            if working_copy(notebook.parent, target):
                print(f"phalanx: copied {notebook.parent}/ to {target}/ (your working copy, "
                      "ignored by git; the next make lab keeps your edits)", flush=True)
            arg = str(target / notebook.name)
        opened.append(arg)
    return opened


if __name__ == "__main__":
    for copied in working_copy(Path(sys.argv[1]), Path(sys.argv[2])):
        print(copied)
