"""`make screenshots`: the README's pictures, taken from a real session.

    python docs/screenshots.py          # writes docs/images/lab-panel.png and run-view.png

The same set-up as the browser tests (tests/browser_support.py): a real JupyterLab in headless
Chromium, a real kernel that starts a 2-engine CPU cluster, trains a small network on scikit-learn's
digits with ``%%distributed_fit`` and fits a learning network on the cluster.  Once the panel
shows the finished run and every DAG node fitted, it takes the whole window (notebook beside the
panel) and the training cell with its run view, then stores both as palette PNGs.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser_support import (  # noqa: E402
    chromium_page,
    execute_command,
    open_notebook,
    open_panel,
    run_cell,
    running_lab,
    widen_right_sidebar,
    write_notebook,
)

IMAGES = ROOT / "docs" / "images"
# Generous: a picture is worth waiting for, and a busy machine starts engines slowly.
CELL_TIMEOUT_MS = 300_000
WAIT_MS = 120_000

CELLS = [
    "%load_ext phalanx\n%cluster start -n 2",
    """import numpy as np, torch
from sklearn.datasets import load_digits
digits = load_digits()
X = torch.tensor(digits.data / 16.0, dtype=torch.float32)
y = torch.tensor(digits.target)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))""",
    """%%distributed_fit --shard X,y --return model --seed 0 --name digits-mlp
from phalanx import log
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(12):
    for i in range(0, len(X), 32):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X[i:i + 32]), y[i:i + 32])
        loss.backward()
        opt.step()
        log(loss=loss.item())""",
    """from sklearn.datasets import load_diabetes
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor
from phalanx.network import machine, node, source
Xd, yd = load_diabetes(return_X_y=True)
Xs, ys = source(Xd, name="X"), source(yd, name="y")
W = machine(StandardScaler(), Xs, name="stand").transform(Xs)
Z = machine(PCA(3), W, name="pca").transform(W)
y1 = machine(Ridge(), Z, ys, name="ridge").predict(Z)
y2 = machine(DecisionTreeRegressor(max_depth=4), Z, ys, name="tree").predict(Z)
yhat = node(lambda a, b: (a + b) / 2, y1, y2, name="blend")
%distributed_fit yhat""",
    "%cluster stop",
]
TRAIN, NETWORK, STOP = 2, 3, 4
MACHINES = 6  # X, y, stand, pca, ridge, tree: the DAG's fitted nodes


def compress(raw: Path, target: Path) -> int:
    """Save ``raw`` as a 256-colour PNG at ``target`` (UI pictures lose nothing visible); bytes."""
    image = Image.open(raw).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        target, optimize=True)
    return target.stat().st_size


def _show(page, cell) -> None:
    """Scroll ``cell`` to the top of the notebook, unfocused, once the layout has settled."""
    page.wait_for_timeout(1500)  # charts and the notebook re-lay out after a resize
    cell.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.wait_for_timeout(500)


def take(page, server, raw: Path) -> None:
    """Drive the session and save the two raw screenshots under ``raw``."""
    write_notebook(server.root / "train.ipynb", CELLS)
    open_notebook(page, server, "train.ipynb")
    panel = open_panel(page)
    for index in range(STOP):
        run_cell(page, index, timeout_ms=CELL_TIMEOUT_MS)
    panel.locator("section[aria-label='Run'][data-status='done']").wait_for()
    page.wait_for_function(
        """n => [...document.querySelectorAll('#phalanx .jp-Phalanx-dagNode')]
                .filter(d => d.dataset.state === 'fitted').length >= n""", arg=MACHINES)
    train = page.locator(".jp-Notebook .jp-Cell").nth(TRAIN)
    train.locator('img[alt^="metric curves"]').wait_for(state="attached")  # hidden by the live view
    execute_command(page, "docmanager:save")
    page.evaluate("() => window.jupyterapp.shell.collapseLeft()")  # room for the notebook
    widen_right_sidebar(page, 175)  # from the panel's own 400 px
    panel.locator(".jp-Phalanx-dagNode[data-node='tree']").click()  # its details, as a person would
    _show(page, train)
    page.screenshot(path=str(raw / "lab-panel.png"))
    # The run view alone: the panel closed, a window tall enough for the whole cell.
    page.evaluate("() => window.jupyterapp.shell.collapseRight()")
    page.set_viewport_size({"width": 980, "height": 1800})
    _show(page, train)
    train.screenshot(path=str(raw / "run-view.png"))
    run_cell(page, STOP, timeout_ms=CELL_TIMEOUT_MS)


def main() -> int:
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="phalanx-screenshots-") as tmp:
        base = Path(tmp)
        (base / "raw").mkdir()
        (base / "lab").mkdir()
        with running_lab(base / "lab", start_timeout_s=WAIT_MS / 1000) as server, \
                chromium_page(1440, 900) as page:
            page.set_default_timeout(WAIT_MS)
            take(page, server, base / "raw")
        for raw in sorted((base / "raw").glob("*.png")):
            size = compress(raw, IMAGES / raw.name)
            print(f"{IMAGES.relative_to(ROOT) / raw.name}: {size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
