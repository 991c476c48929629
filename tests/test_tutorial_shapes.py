"""Code laid out as public tutorials lay it out, cell by cell, trains on 2 real ranks as it does in
one process: lazy modules (a textbook's CNN chapters), a skorch classifier brought back with
``--return``, several networks each with its own optimizer built in earlier cells, and
parameters drawn at random as plain tensors (refused inside the training cell, with the two
ways the manual gives to run them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import run_cell

pytestmark = pytest.mark.cluster


def _reference(*cells: str) -> dict:
    """The same cells in one process, as rank 0 of one (``--seed 0`` seeds torch with 0)."""
    ns: dict = {"__name__": "__main__", "rank": 0, "world_size": 1}
    for cell in cells:
        exec(cell, ns)
    return ns


def _params(model) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def _fit(cell: str, flags: str) -> str:
    return f"%%distributed_fit --no-widget {flags}\n{cell}"


# -- lazy modules: shapes from the first input ----------------------------------------------------

IMAGES = """
import torch
torch.manual_seed(0)
images = torch.randn(32, 1, 12, 12)
labels = (images.mean(dim=(1, 2, 3)) > 0).long()
"""
LAZY_CNN = """
class LeNetish(torch.nn.Module):
    def __init__(self, num_classes=2):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.LazyConv2d(4, kernel_size=3, padding=1), torch.nn.Sigmoid(),
            torch.nn.AvgPool2d(kernel_size=2, stride=2),
            torch.nn.LazyConv2d(6, kernel_size=3), torch.nn.Sigmoid(),
            torch.nn.Flatten(), torch.nn.LazyLinear(16), torch.nn.Sigmoid(),
            torch.nn.LazyLinear(num_classes))

    def forward(self, x):
        return self.net(x)

cnn = LeNetish()
cnn_loss = torch.nn.CrossEntropyLoss()
"""
LAZY_OPTIMIZER = """
cnn_opt = torch.optim.SGD(cnn.parameters(), lr=0.5)   # before any forward: lazy parameters
"""
LAZY_LOOP = """
torch.manual_seed(0)   # the one process draws the lazy values as rank 0 does under --seed 0
for epoch in range(6):
    cnn_opt.zero_grad()
    cnn_loss(cnn(images), labels).backward()
    cnn_opt.step()
"""


def test_lazy_modules_from_earlier_cells_are_synced_once_they_have_shapes(two_engines, shell):
    for cell in (IMAGES, LAZY_CNN, LAZY_OPTIMIZER):
        run_cell(shell, cell)
    # every rank draws its own values at the first forward (seed + rank): rank 0's must win
    run_cell(shell, _fit(LAZY_LOOP, "--shard images,labels --return cnn --seed 0"))
    ref = _reference(IMAGES, LAZY_CNN, LAZY_OPTIMIZER, LAZY_LOOP)
    np.testing.assert_allclose(_params(shell.user_ns["cnn"]), _params(ref["cnn"]), atol=1e-5)


LAZY_IN_CELL = """
torch.manual_seed(1 + rank)     # a different draw on every rank
mlp = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.Tanh(), torch.nn.LazyLinear(1))
for step in range(8):
    loss = ((mlp(X) - y) ** 2).mean()
    mlp.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in mlp.parameters():
            p -= 0.1 * p.grad
"""
REGRESSION = """
import torch
torch.manual_seed(0)
X = torch.randn(64, 5)
y = (X @ torch.linspace(-1.0, 1.0, 5)).unsqueeze(1) + 0.1
"""


def test_a_lazy_model_built_in_the_cell_and_updated_by_hand(two_engines, shell):
    run_cell(shell, REGRESSION)
    run_cell(shell, _fit(LAZY_IN_CELL, "--shard X,y --return mlp"))
    ref = _reference(REGRESSION, LAZY_IN_CELL)
    np.testing.assert_allclose(_params(shell.user_ns["mlp"]), _params(ref["mlp"]), atol=1e-5)


# -- skorch: pickles its module's class by name ---------------------------------------------------

SK_DATA = """
import numpy as np
rng = np.random.default_rng(0)
Xs = rng.normal(size=(64, 6)).astype(np.float32)
ys = (Xs[:, 0] + Xs[:, 1] > 0).astype(np.int64)
"""
SK_MODULE = """
import torch

class ClassifierModule(torch.nn.Module):
    def __init__(self, num_units=10):
        super().__init__()
        self.dense0 = torch.nn.Linear(6, num_units)
        self.output = torch.nn.Linear(num_units, 2)

    def forward(self, X):
        return self.output(torch.relu(self.dense0(X)))
"""
SK_NET = """
from skorch import NeuralNetClassifier

skorch_net = NeuralNetClassifier(
    ClassifierModule, criterion=torch.nn.CrossEntropyLoss, max_epochs=8, lr=0.2,
    batch_size=-1,            # a batch is the whole of each rank's rows: one process's full batch
    train_split=None, verbose=0)
"""
SK_FIT = """
torch.manual_seed(0)
skorch_net.fit(Xs, ys)
"""
SK_PICKLE = """
import pickle
mid_run = pickle.dumps(skorch_net)          # skorch's own __getstate__, inside the run
"""


def test_a_skorch_classifier_trains_and_comes_back(two_engines, shell):
    pytest.importorskip("skorch")
    for cell in (SK_DATA, SK_MODULE, SK_NET):
        run_cell(shell, cell)
    # the cell reads skorch_net, never ClassifierModule: skorch finds it as __main__'s anyway
    run_cell(shell, _fit(SK_FIT + SK_PICKLE, "--shard Xs,ys --return skorch_net,mid_run --seed 0"))
    ref = _reference(SK_DATA, SK_MODULE, SK_NET, SK_FIT)
    ns = shell.user_ns
    got = ns["skorch_net"]
    assert type(got.module_) is ns["ClassifierModule"]
    np.testing.assert_allclose(_params(got.module_), _params(ref["skorch_net"].module_), atol=1e-5)
    np.testing.assert_array_equal(got.predict(ns["Xs"]), ref["skorch_net"].predict(ns["Xs"]))
    import pickle

    assert type(pickle.loads(ns["mid_run"]).module_) is ns["ClassifierModule"]


WHOLE_MODEL = """
import torch

class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 1)

    def forward(self, x):
        return self.fc(x)

holder = {"model": Regressor()}
"""
SAVE_LOOP = """
import io, pickle
model = holder["model"]                      # Regressor itself is never named by the cell
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    opt.zero_grad()
    ((model(X) - y) ** 2).mean().backward()
    opt.step()
"""
SAVE = """
buffer = io.BytesIO()
torch.save(model, buffer)                    # a whole model, by its class's name
saved = buffer.getvalue()
pickled = pickle.dumps(model)
"""


def test_plain_pickle_and_torch_save_of_a_notebook_model_inside_the_run(two_engines, shell):
    for cell in (REGRESSION, WHOLE_MODEL):
        run_cell(shell, cell)
    run_cell(shell, _fit(SAVE_LOOP + SAVE, "--shard X,y --return holder,saved,pickled"))
    import io
    import pickle

    ns = shell.user_ns
    ref = _reference(REGRESSION, WHOLE_MODEL, SAVE_LOOP)
    for model in (pickle.loads(ns["pickled"]),
                  torch.load(io.BytesIO(ns["saved"]), weights_only=False),
                  ns["holder"]["model"]):
        assert type(model) is ns["Regressor"]
        np.testing.assert_allclose(_params(model), _params(ref["model"]), atol=1e-6)


# -- several networks, each with its own optimizer ------------------------------------------------

CURVE = """
import torch
torch.manual_seed(1)
curve_x = torch.unsqueeze(torch.linspace(-1, 1, 64), dim=1)
curve_y = curve_x.pow(2) + 0.1 * torch.normal(torch.zeros(*curve_x.size()))
"""
SMALL_NET = """
class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(1, 20)
        self.predict = torch.nn.Linear(20, 1)

    def forward(self, x):
        return self.predict(torch.relu(self.hidden(x)))
"""
FOUR_NETS = """
torch.manual_seed(2)
net_SGD, net_Momentum, net_RMSprop, net_Adam = SmallNet(), SmallNet(), SmallNet(), SmallNet()
nets = [net_SGD, net_Momentum, net_RMSprop, net_Adam]
"""
FOUR_OPTIMIZERS = """
LR = 0.01
opt_SGD = torch.optim.SGD(net_SGD.parameters(), lr=LR)
opt_Momentum = torch.optim.SGD(net_Momentum.parameters(), lr=LR, momentum=0.8)
opt_RMSprop = torch.optim.RMSprop(net_RMSprop.parameters(), lr=LR, alpha=0.9)
opt_Adam = torch.optim.Adam(net_Adam.parameters(), lr=LR, betas=(0.9, 0.99))
optimizers = [opt_SGD, opt_Momentum, opt_RMSprop, opt_Adam]
"""
LOADER = """
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(curve_x, curve_y), batch_size=8, shuffle=True)
loss_func = torch.nn.MSELoss()
"""
FOUR_LOOP = """
losses_his = [[], [], [], []]
for epoch in range(13):                      # 8 batches an epoch: past the guard's step 100
    for step, (b_x, b_y) in enumerate(loader):
        for net, opt, l_his in zip(nets, optimizers, losses_his):
            loss = loss_func(net(b_x), b_y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            l_his.append(loss.item())
"""


def _full_mse(net, x, y) -> float:
    with torch.no_grad():
        return float(((net(x) - y) ** 2).mean())


def test_four_networks_with_optimizers_from_earlier_cells_stay_one_model_each(two_engines, shell):
    for cell in (CURVE, SMALL_NET, FOUR_NETS, FOUR_OPTIMIZERS, LOADER):
        run_cell(shell, cell)
    # each rank shuffles the whole set in its own order (--seed: seed + rank), so the averaged
    # gradient is of two batches: the guard (every 100 steps and at the end) checks that every
    # network is still one model on both ranks
    run_cell(shell, _fit(FOUR_LOOP, "--return nets,losses_his --seed 0"))
    ref = _reference(CURVE, SMALL_NET, FOUR_NETS, FOUR_OPTIMIZERS, LOADER,
                     "torch.manual_seed(0)\n" + FOUR_LOOP)
    ns = shell.user_ns
    assert all(len(h) == 13 * 8 for h in ns["losses_his"])
    x, y = ns["curve_x"], ns["curve_y"]
    for got, want, before in zip(ns["nets"], ref["nets"], _reference(
            CURVE, SMALL_NET, FOUR_NETS)["nets"]):
        # trained as one process trains it: the loss on the whole curve falls as far
        start, ours, theirs = (_full_mse(n, x, y) for n in (before, got, want))
        assert ours < start and abs(ours - theirs) < 0.25 * theirs, (start, ours, theirs)


HAND_WRITTEN_FOUR = """
torch.manual_seed(1 + rank)                  # every rank builds different networks
nets = [SmallNet() for _ in range(4)]
rates = [0.05, 0.1, 0.2, 0.3]
for step in range(10):
    for net, lr in zip(nets, rates):
        loss = ((net(curve_x) - curve_y) ** 2).mean()
        net.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
"""


def test_four_networks_built_in_the_cell_and_updated_by_hand_in_turn(two_engines, shell):
    for cell in (CURVE, SMALL_NET):
        run_cell(shell, cell)
    run_cell(shell, _fit(HAND_WRITTEN_FOUR, "--shard curve_x,curve_y --return nets"))
    ref = _reference(CURVE, SMALL_NET, HAND_WRITTEN_FOUR)
    for got, want in zip(shell.user_ns["nets"], ref["nets"]):
        np.testing.assert_allclose(_params(got), _params(want), atol=1e-5)


# -- parameters drawn as plain tensors (linear regression from scratch) ---------------------------

SYNTHETIC = """
import torch
torch.manual_seed(0)
true_w, true_b = torch.tensor([2.0, -3.4]), 4.2
features = torch.normal(0, 1, (64, 2))
targets = (features @ true_w + true_b + torch.normal(0, 0.01, (64,))).reshape(-1, 1)
"""
INIT_PARAMS = """
w = torch.normal(0, 0.01, size=(2, 1), requires_grad=True)
b = torch.zeros(1, requires_grad=True)
"""
SCRATCH_LOOP = """
def linreg(X, w, b):
    return X @ w + b

def sgd(params, lr):
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad
            param.grad.zero_()

for epoch in range(5):
    loss = ((linreg(features, w, b) - targets) ** 2 / 2).mean()
    loss.backward()
    sgd([w, b], 0.3)
"""
SHARDED = "--shard features,targets --return w,b --seed 0"


def test_parameters_drawn_in_the_training_cell_are_refused_by_name(two_engines, shell):
    run_cell(shell, SYNTHETIC)
    with pytest.raises(Exception, match=r"(?s)w is trained in this backward pass but held different "
                                        r"values on different ranks.*phalanx\.broadcast\(w\)"):
        run_cell(shell, _fit(INIT_PARAMS + SCRATCH_LOOP, SHARDED))


@pytest.mark.parametrize("cells", [
    (INIT_PARAMS, SCRATCH_LOOP),  # drawn in an earlier cell: shipped, the same on every rank
    ("", INIT_PARAMS + "from phalanx import broadcast\nbroadcast(w)\n" + SCRATCH_LOOP),
], ids=["earlier-cell", "broadcast"])
def test_parameters_drawn_as_the_manual_says_train_as_in_one_process(two_engines, shell, cells):
    init, loop = cells
    run_cell(shell, SYNTHETIC + "torch.manual_seed(0)\n" + init)
    run_cell(shell, _fit(loop, SHARDED))
    ref = _reference(SYNTHETIC, "torch.manual_seed(0)\n" + init, loop.replace(
        "from phalanx import broadcast\nbroadcast(w)\n", ""))
    ns = shell.user_ns
    np.testing.assert_allclose(ns["w"].detach(), ref["w"].detach(), atol=1e-6)
    np.testing.assert_allclose(ns["b"].detach(), ref["b"].detach(), atol=1e-6)


def test_easgd_refuses_parameters_that_appear_after_it_started():
    """EASGD pairs its centre with the parameters by position: a lazy module's parameters,
    materialised after the optimizer was built, would be pulled toward another one's centre."""
    from phalanx.runtime.sync._strategies import EASGD
    from phalanx.runtime.transport._comm import make_thread_communicators

    first, later = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    strategy = EASGD(make_thread_communicators(1)[0], every=1)
    strategy.start([first])
    with pytest.raises(RuntimeError, match=r"EASGD started with 1 parameters and now steps 2.*"
                                           r"Build the optimizer after one forward pass"):
        strategy.after_step([first, later], 0)
