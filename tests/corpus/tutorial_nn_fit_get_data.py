"""nn_tutorial, "Create fit() and get_data()": the tutorial's three-line cell
``train_dl, valid_dl = get_data(train_ds, valid_ds, bs)``, ``model, opt = get_model()``,
``fit(epochs, model, loss_func, opt, train_dl, valid_dl)``, with ``get_model`` (model and SGD
built in a notebook function), ``loss_batch`` and ``fit`` from the cells before it.

Source: pytorch/tutorials beginner_source/nn_tutorial.py ("What is torch.nn really?")
commit 05e7ce2c19e72d482475d91d458db210cdacec38, BSD-3-Clause.

Shape: multi-cell; optimizer built inside a notebook function called by the fit cell; the
training DataLoader shuffles (``shuffle=True``), so each rank draws its own order.

Replaced: the MNIST download and its ``gzip``/``pickle`` read (first cell) by generated numpy
arrays of the same kinds (512 training and 128 validation rows of 784 pixels, mostly 0, labels from a
fixed random linear teacher).  The cell that shows an image with ``pyplot.imshow`` is left out.
Cells of the earlier sections that this section's code does not use (the from-scratch model,
the earlier training loops, the prints) are left out; ``lr``/``epochs`` and ``bs`` are the lines
of the earlier cells that define them.

Judged against ``wrap()``: the shuffled order is drawn per rank (``--seed`` seeds each rank
differently), so no single process sees the same batches.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/nn_tutorial.py",
          "commit": "05e7ce2c19e72d482475d91d458db210cdacec38", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "optimizer (built in a notebook function)"}

CELLS = [
    '''
# REPLACED: the MNIST download (DATA_PATH, PATH, URL, FILENAME; requests.get(URL + FILENAME)
# written to data/mnist/mnist.pkl.gz) and its read:
#   with gzip.open(PATH / FILENAME, "rb") as f:
#       ((x_train, y_train), (x_valid, y_valid), _) = pickle.load(f, encoding="latin-1")
# by generated numpy arrays of the same kinds: float32 rows of 784 pixels in [0, 1), mostly 0
# as in MNIST, and int64 labels from a fixed random linear teacher; 50000/10000 rows -> 512/128.
import numpy as np
_rng = np.random.default_rng(0)
_teacher = _rng.normal(size=(784, 10))
_x = _rng.random((640, 784), dtype=np.float32) * (_rng.random((640, 784)) < 0.15)
_y = ((_x - _x.mean(0)) @ _teacher).argmax(1)
x_train, y_train = _x[:512], _y[:512]
x_valid, y_valid = _x[512:], _y[512:]
''',
    '''
import torch

x_train, y_train, x_valid, y_valid = map(
    torch.tensor, (x_train, y_train, x_valid, y_valid)
)
n, c = x_train.shape
x_train, x_train.shape, y_train.min(), y_train.max()
print(x_train, y_train)
print(x_train.shape)
print(y_train.min(), y_train.max())
''',
    '''
lr = 0.5  # learning rate
epochs = 2  # how many epochs to train for
''',
    '''
bs = 64  # batch size
''',
    '''
import torch.nn.functional as F

loss_func = F.cross_entropy
''',
    '''
from torch import nn

class Mnist_Logistic(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(784, 10)

    def forward(self, xb):
        return self.lin(xb)
''',
    '''
from torch import optim
''',
    '''
def get_model():
    model = Mnist_Logistic()
    return model, optim.SGD(model.parameters(), lr=lr)
''',
    '''
from torch.utils.data import TensorDataset
''',
    '''
from torch.utils.data import DataLoader
''',
    '''
train_ds = TensorDataset(x_train, y_train)
train_dl = DataLoader(train_ds, batch_size=bs, shuffle=True)

valid_ds = TensorDataset(x_valid, y_valid)
valid_dl = DataLoader(valid_ds, batch_size=bs * 2)
''',
    '''
def loss_batch(model, loss_func, xb, yb, opt=None):
    loss = loss_func(model(xb), yb)

    if opt is not None:
        loss.backward()
        opt.step()
        opt.zero_grad()

    return loss.item(), len(xb)
''',
    '''
import numpy as np

def fit(epochs, model, loss_func, opt, train_dl, valid_dl):
    for epoch in range(epochs):
        model.train()
        for xb, yb in train_dl:
            loss_batch(model, loss_func, xb, yb, opt)

        model.eval()
        with torch.no_grad():
            losses, nums = zip(
                *[loss_batch(model, loss_func, xb, yb) for xb, yb in valid_dl]
            )
        val_loss = np.sum(np.multiply(losses, nums)) / np.sum(nums)

        print(epoch, val_loss)
''',
    '''
def get_data(train_ds, valid_ds, bs):
    return (
        DataLoader(train_ds, batch_size=bs, shuffle=True),
        DataLoader(valid_ds, batch_size=bs * 2),
    )
''',
]

FIT = '''
train_dl, valid_dl = get_data(train_ds, valid_ds, bs)
model, opt = get_model()
fit(epochs, model, loss_func, opt, train_dl, valid_dl)
'''

SHARD = None   # train_ds is a TensorDataset built in the notebook: every rank reads all of it
RETURN = "model"
SEED = 0
JUDGE = "wrap"
WRAP = [("model, opt = get_model()", "model, opt = get_model()\nmodel = wrap(model)")]


def progress(ns, objs):
    import torch

    torch.manual_seed(0)
    untrained, _ = ns["get_model"]()
    with torch.no_grad():
        return (float(ns["loss_func"](untrained(ns["x_train"]), ns["y_train"])),
                float(ns["loss_func"](objs["model"](ns["x_train"]), ns["y_train"])))
