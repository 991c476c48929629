"""`make demo`: run the quickstart notebook headless on a local 2-engine CPU cluster and print
what it found.  The executed notebook is written to notebooks/executed/ for a look."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def main() -> int:
    source = HERE / "01-quickstart.ipynb"
    nb = nbformat.read(source, as_version=4)
    started = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    elapsed = time.perf_counter() - started
    out = HERE / "executed"
    out.mkdir(exist_ok=True)
    nbformat.write(nb, out / source.name)
    texts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("name") == "stdout":
                texts.append(output["text"])
    print("".join(t for t in texts if "accuracy" in t or "stopped" in t).strip())
    print(f"quickstart executed in {elapsed:.1f} s -> {out / source.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
