"""Writes 01-quickstart.ipynb (kept as code so the notebook's source is reviewable)."""

import nbformat as nbf

cells = [
    nbf.v4.new_markdown_cell(
        "# phalanx quickstart\n\n"
        "Train a small PyTorch network on a 2-engine cluster without leaving the notebook: "
        "start engines, run an ordinary training loop data-parallel with `%%distributed_fit`, "
        "validate across shards, scale, re-run.\n\n"
        "Everything runs on CPU engines here; on a GPU machine `%cluster start` gives each "
        "engine its own GPU. The data is scikit-learn's bundled digits set: nothing is downloaded."),
    nbf.v4.new_code_cell("%load_ext phalanx\n%cluster start -n 2"),
    nbf.v4.new_markdown_cell("Data: 8x8 digit images, standardised, split into train and test."),
    nbf.v4.new_code_cell(
        "import numpy as np, torch\n"
        "from sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n\n"
        "digits = load_digits()\n"
        "X = (digits.data / 16.0).astype(np.float32)\n"
        "Xtr, Xte, ytr, yte = train_test_split(X, digits.target, test_size=0.25, random_state=0)\n"
        "Xtr, Xte = torch.from_numpy(Xtr), torch.from_numpy(Xte)\n"
        "ytr, yte = torch.from_numpy(ytr), torch.from_numpy(yte)\n"
        "Xtr.shape, Xte.shape"),
    nbf.v4.new_markdown_cell(
        "A model defined right here in the notebook. phalanx ships it to the engines by value."),
    nbf.v4.new_code_cell(
        "class MLP(torch.nn.Module):\n"
        "    def __init__(self, hidden=64):\n"
        "        super().__init__()\n"
        "        self.net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),\n"
        "                                       torch.nn.Linear(hidden, 10))\n"
        "    def forward(self, x):\n"
        "        return self.net(x)\n\n"
        "torch.manual_seed(0)\n"
        "model = MLP()"),
    nbf.v4.new_markdown_cell(
        "The training loop is an ordinary single-process loop. `--shard Xtr,ytr` gives each rank "
        "its own rows; gradients are averaged across ranks at every `opt.step()` (`--sync "
        "allreduce`, the default); `--return model` brings the trained model back."),
    nbf.v4.new_code_cell(
        "%%distributed_fit --shard Xtr,ytr --return model --seed 0 --steps 240\n"
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
    nbf.v4.new_markdown_cell(
        "The whole metric history of every rank stays in the kernel, as a table to plot:"),
    nbf.v4.new_code_cell(
        "import phalanx\n"
        "train_run = phalanx.last_run()\n"
        "train_run.history.to_pandas().groupby('rank').loss.agg(['count', 'first', 'last'])"),
    nbf.v4.new_markdown_cell(
        "Distributed validation: each rank scores its shard of the test set, `allreduce` adds "
        "the counts."),
    nbf.v4.new_code_cell(
        "%%distributed_fit --shard Xte,yte --return totals\n"
        "from phalanx import allreduce\n"
        "with torch.no_grad():\n"
        "    correct = (model(Xte).argmax(1) == yte).sum().item()\n"
        "totals = allreduce({'correct': correct, 'seen': len(yte)}, op='sum')"),
    nbf.v4.new_code_cell(
        "accuracy = totals['correct'] / totals['seen']\n"
        "print(f'test accuracy: {accuracy:.3f}')"),
    nbf.v4.new_markdown_cell(
        "Scale to 3 engines and train again: the process group re-forms on its own."),
    nbf.v4.new_code_cell("%cluster scale 3"),
    nbf.v4.new_code_cell(
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
    nbf.v4.new_code_cell(
        "with torch.no_grad():\n"
        "    accuracy_3 = (model(Xte).argmax(1) == yte).float().mean().item()\n"
        "print(f'test accuracy after training on 3 engines: {accuracy_3:.3f}')"),
    nbf.v4.new_code_cell("%cluster stop"),
]

nb = nbf.v4.new_notebook(cells=cells, metadata={
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"name": "python"}})
nbf.write(nb, "01-quickstart.ipynb")
