"""nn_tutorial, "Refactor using nn.Module": ``Mnist_Logistic`` with ``nn.Parameter``s and a
notebook function ``fit()`` that takes no arguments (it reads ``model``, ``x_train``, ``lr``,
``epochs``, ... as notebook globals) and updates the parameters by hand; the fit cell is the
tutorial's own one-line cell ``fit()``.

Source: pytorch/tutorials beginner_source/nn_tutorial.py ("What is torch.nn really?")
commit 05e7ce2c19e72d482475d91d458db210cdacec38, BSD-3-Clause.

Shape: multi-cell; manual update (``p -= p.grad * lr``) inside a notebook function that reads
globals, no torch optimizer.

Replaced: the MNIST download and its ``gzip``/``pickle`` read (first cell) by generated numpy
arrays of the same kinds (512 training and 128 validation rows of 784 pixels, mostly 0, labels from a
fixed random linear teacher).  The cell that shows an image with ``pyplot.imshow`` is left out.
Cells of the earlier sections that this section's code does not use (the from-scratch model,
its training loop, the prints) are left out; ``lr``/``epochs`` and ``bs``/``xb``/``yb`` are the
lines of the earlier cells that define them.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/nn_tutorial.py",
          "commit": "05e7ce2c19e72d482475d91d458db210cdacec38", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "manual (in a notebook function reading globals)"}

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

xb = x_train[0:bs]  # a mini-batch from x
yb = y_train[0:bs]
''',
    '''
import torch.nn.functional as F

loss_func = F.cross_entropy
''',
    '''
import math
from torch import nn

class Mnist_Logistic(nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = nn.Parameter(torch.randn(784, 10) / math.sqrt(784))
        self.bias = nn.Parameter(torch.zeros(10))

    def forward(self, xb):
        return xb @ self.weights + self.bias
''',
    '''
model = Mnist_Logistic()
''',
    '''
print(loss_func(model(xb), yb))
''',
    '''
def fit():
    for epoch in range(epochs):
        for i in range((n - 1) // bs + 1):
            start_i = i * bs
            end_i = start_i + bs
            xb = x_train[start_i:end_i]
            yb = y_train[start_i:end_i]
            pred = model(xb)
            loss = loss_func(pred, yb)

            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= p.grad * lr
                model.zero_grad()
''',
]

FIT = '''
fit()
'''

SHARD = None
RETURN = "model"
SEED = 0
JUDGE = "single"


def progress(ns, objs):
    import torch

    with torch.no_grad():
        return (float(ns["loss_func"](ns["model"](ns["x_train"]), ns["y_train"])),
                float(ns["loss_func"](objs["model"](ns["x_train"]), ns["y_train"])))
