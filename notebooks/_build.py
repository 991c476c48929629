"""Writes the notebooks from their source here, so a notebook change is a reviewable diff.

    python notebooks/_build.py          # rewrites every notebook (outputs cleared)
    make notebooks                      # rewrites and executes them, saved with their outputs
"""

from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).resolve().parent
md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell

QUICKSTART = [
    md(
        "# phalanx quickstart\n\n"
        "Train a small PyTorch network on a 2-engine cluster without leaving the notebook: "
        "start engines, run an ordinary training loop data-parallel with `%%distributed_fit`, "
        "validate across shards, scale, re-run.\n\n"
        "Everything runs on CPU engines here; on a GPU machine `%cluster start` gives each "
        "engine its own GPU. The data is scikit-learn's bundled digits set: nothing is downloaded."),
    code("%load_ext phalanx\n%cluster start -n 2"),
    md("Data: 8x8 digit images, standardised, split into train and test."),
    code(
        "import numpy as np, torch\n"
        "from sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n\n"
        "digits = load_digits()\n"
        "X = (digits.data / 16.0).astype(np.float32)\n"
        "Xtr, Xte, ytr, yte = train_test_split(X, digits.target, test_size=0.25, random_state=0)\n"
        "Xtr, Xte = torch.from_numpy(Xtr), torch.from_numpy(Xte)\n"
        "ytr, yte = torch.from_numpy(ytr), torch.from_numpy(yte)\n"
        "Xtr.shape, Xte.shape"),
    md(
        "A model defined right here in the notebook. phalanx ships it to the engines by value."),
    code(
        "class MLP(torch.nn.Module):\n"
        "    def __init__(self, hidden=64):\n"
        "        super().__init__()\n"
        "        self.net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),\n"
        "                                       torch.nn.Linear(hidden, 10))\n"
        "    def forward(self, x):\n"
        "        return self.net(x)\n\n"
        "torch.manual_seed(0)\n"
        "model = MLP()"),
    md(
        "The training loop is an ordinary single-process loop. `--shard Xtr,ytr` gives each rank "
        "its own rows; gradients are averaged across ranks when `loss.backward()` returns "
        "(`--sync allreduce`, the default, as in DistributedDataParallel), so `opt.step()` steps "
        "with the average; `--return model` brings the trained model back."),
    code(
        "%%distributed_fit --shard Xtr,ytr --return model --seed 0 --steps 260\n"
        "from phalanx import log\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)\n"
        "for epoch in range(20):\n"
        "    for i in range(0, len(Xtr), 56):\n"
        "        xb, yb = Xtr[i:i + 56], ytr[i:i + 56]\n"
        "        opt.zero_grad()\n"
        "        loss = torch.nn.functional.cross_entropy(model(xb), yb)\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "        log(loss=loss.item())"),
    md(
        "The whole metric history of every rank stays in the kernel, as a table to plot:"),
    code(
        "import phalanx\n"
        "train_run = phalanx.last_run()\n"
        "train_run.history.to_pandas().groupby('rank').loss.agg(['count', 'first', 'last'])"),
    md(
        "Distributed validation: each rank scores its shard of the test set, `allreduce` adds "
        "the counts."),
    code(
        "%%distributed_fit --shard Xte,yte --return totals\n"
        "from phalanx import allreduce\n"
        "with torch.no_grad():\n"
        "    correct = (model(Xte).argmax(1) == yte).sum().item()\n"
        "totals = allreduce({'correct': correct, 'seen': len(yte)}, op='sum')"),
    code(
        "accuracy = totals['correct'] / totals['seen']\n"
        "print(f'test accuracy: {accuracy:.3f}')"),
    md(
        "Scale to 3 engines and train again: the process group re-forms on its own."),
    code("%cluster scale 3"),
    code(
        "%%distributed_fit --shard Xtr,ytr --return model --seed 0\n"
        "from phalanx import log\n"
        "model = MLP()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)\n"
        "for epoch in range(20):\n"
        "    for i in range(0, len(Xtr), 56):\n"
        "        opt.zero_grad()\n"
        "        loss = torch.nn.functional.cross_entropy(model(Xtr[i:i + 56]), ytr[i:i + 56])\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "        log(loss=loss.item())"),
    code(
        "with torch.no_grad():\n"
        "    accuracy_3 = (model(Xte).argmax(1) == yte).float().mean().item()\n"
        "print(f'test accuracy after training on 3 engines: {accuracy_3:.3f}')"),
    code("%cluster stop"),
]

TRAIN_CELL = """
from phalanx import log, bytes_sent
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(300):
    i = (step * 32) % (len(X) - 32)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X[i:i + 32]), y[i:i + 32])
    loss.backward()
    opt.step()
    log(loss=loss.item(), mbytes=bytes_sent() / 1e6)
"""

SYNC_STRATEGIES = [
    md("# Sync strategies: allreduce, local SGD and EASGD on the same task\n\n"
       "The same model, data, seed and number of steps, trained on 2 engines with three ways of "
       "keeping the ranks together. Each run logs its loss and the bytes it has sent through "
       "phalanx's collectives, so we can compare loss against steps and against communication."),
    code("%load_ext phalanx\n%cluster start -n 2"),
    code("import copy\n"
         "import numpy as np, pandas as pd, torch\n"
         "import phalanx\n"
         "from sklearn.datasets import load_digits\n"
         "digits = load_digits()\n"
         "X = torch.tensor(digits.data / 16.0, dtype=torch.float32)\n"
         "y = torch.tensor(digits.target)\n"
         "torch.manual_seed(0)\n"
         "model0 = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))"),
    md("The training loop, run once per strategy (the flags change, the loop does not). "
       "`bytes_sent()` counts what this rank has sent so far."),
    code(f"TRAIN = {TRAIN_CELL!r}\n"
         "runs = {}\n"
         "for flags in ['--sync allreduce', '--sync localsgd --every 8', '--sync easgd --every 8 --alpha 0.5']:\n"
         "    model = copy.deepcopy(model0)\n"
         "    get_ipython().run_cell_magic('distributed_fit', f'--shard X,y --seed 0 --return model {flags}', TRAIN)\n"
         "    runs[flags.split()[1]] = (phalanx.last_run().history.to_pandas(), model)"),
    md("## A strategy written here\n\n"
       "A sync rule is a small class: subclass `SyncStrategy` and override the hooks phalanx calls "
       "around every `opt.step()` (`before_step` after backward, `after_step` after the step). "
       "`self.comm` is the run's communicator, `param_values(params)` the arrays to average and "
       "`latest_metrics()` what this rank last passed to `log()`.\n\n"
       "This one follows AdaComm (Wang and Joshi, 2019): average the parameters every K steps, "
       "starting from K = `--every` and shrinking K as the loss falls (K = K0 * sqrt(loss / "
       "first loss)), since late in training the ranks drift apart faster relative to the progress "
       "left to make. Each rank logged its own loss, so the ranks first agree on the mean loss "
       "(one number through `self.comm`): every rank must take the same decision, or one would "
       "wait in a collective the other never enters."),
    code("import math\n"
         "from phalanx import SyncStrategy, param_values, latest_metrics, log\n\n"
         "class AdaComm(SyncStrategy):\n"
         "    def start(self, params):\n"
         "        super().start(params)  # every rank starts from rank 0's parameters\n"
         "        self.period, self.last_sync, self.first_loss = self.every, -1, None\n\n"
         "    def after_step(self, params, step):\n"
         "        if step - self.last_sync < self.period:\n"
         "            return\n"
         "        self.comm.allreduce(param_values(params), op='mean')\n"
         "        loss = np.array([latest_metrics().get('loss', np.nan)])\n"
         "        self.comm.allreduce(loss, op='mean')  # the same number on every rank\n"
         "        if np.isfinite(loss).all():\n"
         "            self.first_loss = self.first_loss or loss.item()\n"
         "            self.period = max(1, math.ceil(self.every * math.sqrt(loss.item() / self.first_loss)))\n"
         "        self.last_sync = step\n"
         "        log(period=self.period)\n\n"
         "    def finish(self, params):  # end on one model\n"
         "        self.comm.allreduce(param_values(params), op='mean')"),
    md("Pass the class by its name. phalanx ships it to the engines like any notebook class, and "
       "again whenever the cell defining it runs again."),
    code("model = copy.deepcopy(model0)"),
    code("%%distributed_fit --shard X,y --seed 0 --return model --sync AdaComm --every 16" + TRAIN_CELL.rstrip()),
    code("frame = phalanx.last_run().history.to_pandas()\n"
         "runs['AdaComm'] = (frame, model)\n"
         "periods = frame[frame['rank'] == 0].period.dropna().astype(int).tolist()\n"
         "print('K after each synchronisation:', periods)"),
    md("Loss (mean over ranks, smoothed) against optimizer steps and against megabytes sent."),
    code("import matplotlib.pyplot as plt\n"
         "fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))\n"
         "for name, (frame, _) in runs.items():\n"
         "    per_step = frame.groupby('step')[['loss', 'mbytes']].mean()\n"
         "    smooth = per_step.loss.rolling(20, min_periods=1).mean()\n"
         "    a.plot(per_step.index, smooth, label=name)\n"
         "    b.plot(per_step.mbytes, smooth, label=name)\n"
         "a.set(xlabel='optimizer step', ylabel='training loss', title='loss vs steps')\n"
         "b.set(xlabel='MB sent per rank', ylabel='training loss', title='loss vs communication')\n"
         "a.legend(); b.legend(); plt.tight_layout()"),
    code("summary = pd.DataFrame({\n"
         "    name: {'final loss': frame.groupby('step').loss.mean().iloc[-20:].mean(),\n"
         "           'MB sent per rank': frame.mbytes.max(),\n"
         "           'train accuracy': (m(X).argmax(1) == y).float().mean().item()}\n"
         "    for name, (frame, m) in runs.items()}).T\n"
         "summary"),
    md("Local SGD and EASGD reach a loss close to per-step gradient averaging while sending a "
       "fraction of its bytes: they only talk every 8 steps. The notebook's AdaComm talks rarely "
       "at first and more often as the loss falls, for a similar budget."),
    code("%cluster stop"),
]

INCREMENTAL = [
    md("# Incremental scikit-learn learners on shards\n\n"
       "An `SGDClassifier` trained with `partial_fit` on each engine's shard of the digits data; "
       "phalanx averages `coef_` and `intercept_` across ranks (after every batch with "
       "`allreduce`, every K batches with `localsgd`). The loop is the one you would write on one "
       "machine."),
    code("%load_ext phalanx\n%cluster start -n 2"),
    code("import numpy as np\n"
         "from sklearn.datasets import load_digits\n"
         "from sklearn.linear_model import SGDClassifier\n"
         "from sklearn.model_selection import train_test_split\n"
         "from sklearn.preprocessing import StandardScaler\n"
         "digits = load_digits()\n"
         "Xtr, Xte, ytr, yte = train_test_split(StandardScaler().fit_transform(digits.data), digits.target,\n"
         "                                      test_size=0.25, random_state=0)\n"
         "classes = np.arange(10)"),
    md("The single-process reference:"),
    code("single = SGDClassifier(loss='log_loss', alpha=1e-3, random_state=0)\n"
         "for epoch in range(5):\n"
         "    for i in range(0, len(Xtr), 100):\n"
         "        single.partial_fit(Xtr[i:i + 100], ytr[i:i + 100], classes=classes)\n"
         "single_accuracy = single.score(Xte, yte)\n"
         "single_accuracy"),
    md("The same loop on 2 shards, parameters averaged after every `partial_fit`:"),
    code("clf = SGDClassifier(loss='log_loss', alpha=1e-3, random_state=0)"),
    code("%%distributed_fit --shard Xtr,ytr --return clf --seed 0\n"
         "for epoch in range(5):\n"
         "    for i in range(0, len(Xtr), 50):\n"
         "        clf.partial_fit(Xtr[i:i + 50], ytr[i:i + 50], classes=classes)"),
    code("averaged_accuracy = clf.score(Xte, yte)\n"
         "print(f'single process {single_accuracy:.3f}, 2 shards averaged every batch {averaged_accuracy:.3f}')"),
    md("Averaging only every 5 batches (local SGD) sends a fifth of the parameters:"),
    code("clf = SGDClassifier(loss='log_loss', alpha=1e-3, random_state=0)"),
    code("%%distributed_fit --shard Xtr,ytr --return clf --seed 0 --sync localsgd --every 5\n"
         "for epoch in range(5):\n"
         "    for i in range(0, len(Xtr), 50):\n"
         "        clf.partial_fit(Xtr[i:i + 50], ytr[i:i + 50], classes=classes)"),
    code("localsgd_accuracy = clf.score(Xte, yte)\n"
         "print(f'2 shards averaged every 5 batches {localsgd_accuracy:.3f}')"),
    code("%cluster stop"),
]

NETWORKS = [
    md("# Learning networks: retrain only what changed, fit branches in parallel\n\n"
       "A learning network wires scikit-learn-style models into a DAG (the idea comes from MLJ). "
       "Fitting a node fits every machine it depends on; fitting again retrains only what a "
       "change affects, and says why. On a cluster, independent branches fit at the same time."),
    code("import numpy as np\n"
         "from sklearn.datasets import load_diabetes\n"
         "from sklearn.decomposition import PCA\n"
         "from sklearn.linear_model import Ridge\n"
         "from sklearn.preprocessing import StandardScaler\n"
         "from sklearn.tree import DecisionTreeRegressor\n"
         "from phalanx.network import source, machine, node\n\n"
         "data = load_diabetes()\n"
         "X_train, y_train = data.data[:350], data.target[:350]\n"
         "X_test, y_test = data.data[350:], data.target[350:]"),
    md("A blend of a ridge regression and a decision tree, both on the first PCA components of "
       "the standardised inputs:"),
    code("X, y = source(X_train, name='X'), source(y_train, name='y')\n"
         "stand = machine(StandardScaler(), X, name='stand');               W = stand.transform(X)\n"
         "pca   = machine(PCA(3), W, name='pca');                           Z = pca.transform(W)\n"
         "ridge = machine(Ridge(), Z, y, name='ridge');                     y1 = ridge.predict(Z)\n"
         "tree  = machine(DecisionTreeRegressor(max_depth=5, random_state=0), Z, y, name='tree'); y2 = tree.predict(Z)\n"
         "yhat  = node(lambda a, b: 0.5 * a + 0.5 * b, y1, y2, name='blend')\n"
         "yhat"),
    md("The first fit trains everything:"),
    code("log = yhat.fit()\nlog"),
    md("Change one hyperparameter of the tree: only the tree retrains."),
    code("tree.model.set_params(max_depth=3)\n"
         "log_tree = yhat.fit()\n"
         "log_tree"),
    md("Changes are compared by value with what each machine was last trained with: setting "
       "a parameter to another value and back before fitting retrains nothing."),
    code("tree.model.set_params(max_depth=8)\n"
         "tree.model.set_params(max_depth=3)\n"
         "log_same = yhat.fit()\n"
         "log_same.actions"),
    md("Changing PCA retrains PCA and everything downstream of it, but not the scaler:"),
    code("pca.model.set_params(n_components=4)\n"
         "log_pca = yhat.fit()\n"
         "log_pca"),
    md("New targets: the machines that see `y` retrain; the unsupervised ones do not."),
    code("y.rebind(y_train * 1.0 + 1.0)\n"
         "log_y = yhat.fit()\n"
         "log_y"),
    code("from sklearn.metrics import r2_score\n"
         "network_r2 = r2_score(y_test + 1.0, yhat(X_test))\n"
         "print(f'test R^2 of the blend: {network_r2:.3f}')"),
    md("## On the cluster\n\n"
       "`%distributed_fit yhat` fits the network on the engines (dask runs on the ipyparallel "
       "engines): the two branches fit at the same time, intermediate outputs stay on the "
       "workers, and only the fitted machines come back. The DAG's states stream to the "
       "JupyterLab panel."),
    code("%load_ext phalanx\n%cluster start -n 2"),
    code("tree.model.set_params(max_depth=4); ridge.model.set_params(alpha=2.0)\n"
         "log_cluster = %distributed_fit yhat\n"
         "log_cluster"),
    code("print('machines fitted on the engines:', sorted(name for name, action in log_cluster.actions.items() if action != 'skip'))\n"
         "print(f'test R^2 after the cluster fit: {r2_score(y_test + 1.0, yhat(X_test)):.3f}')"),
    code("%cluster stop"),
]

NOTEBOOKS = {
    "01-quickstart.ipynb": QUICKSTART,
    "02-learning-networks.ipynb": NETWORKS,
    "03-sync-strategies.ipynb": SYNC_STRATEGIES,
    "04-incremental-sklearn.ipynb": INCREMENTAL,
}


def build(name: str) -> nbf.NotebookNode:
    """Notebook ``name`` as its source here says, without outputs (a fresh copy each call)."""
    cells = [nbf.from_dict(dict(cell)) for cell in NOTEBOOKS[name]]
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: rebuilding gives no spurious diff
    return nbf.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}})


def write_all() -> None:
    for name in NOTEBOOKS:
        nbf.write(build(name), HERE / name)


if __name__ == "__main__":
    write_all()
