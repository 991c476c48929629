"""nn_tutorial, "Neural net from scratch (no torch.nn)": raw ``weights``/``bias`` tensors with
``requires_grad``, a notebook function ``model`` that reads them as globals, and a hand-written
SGD update in the fit cell.

Source: pytorch/tutorials beginner_source/nn_tutorial.py ("What is torch.nn really?")
commit 05e7ce2c19e72d482475d91d458db210cdacec38, BSD-3-Clause.

Shape: multi-cell (the tutorial's code blocks up to and including its first training loop, which
is the fit cell); manual update, no torch optimizer.

Replaced: the MNIST download and its ``gzip``/``pickle`` read (first cell) by generated numpy
arrays of the same kinds (512 training and 128 validation rows of 784 pixels, mostly 0, labels from a
fixed random linear teacher).  The cell that shows an image with ``pyplot.imshow`` is left out.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/nn_tutorial.py",
          "commit": "05e7ce2c19e72d482475d91d458db210cdacec38", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "manual (raw tensors, notebook function reads them)"}

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
import math

weights = torch.randn(784, 10) / math.sqrt(784)
weights.requires_grad_()
bias = torch.zeros(10, requires_grad=True)
''',
    '''
def log_softmax(x):
    return x - x.exp().sum(-1).log().unsqueeze(-1)

def model(xb):
    return log_softmax(xb @ weights + bias)
''',
    '''
bs = 64  # batch size

xb = x_train[0:bs]  # a mini-batch from x
preds = model(xb)  # predictions
preds[0], preds.shape
print(preds[0], preds.shape)
''',
    '''
def nll(input, target):
    return -input[range(target.shape[0]), target].mean()

loss_func = nll
''',
    '''
yb = y_train[0:bs]
print(loss_func(preds, yb))
''',
    '''
def accuracy(out, yb):
    preds = torch.argmax(out, dim=1)
    return (preds == yb).float().mean()
''',
    '''
print(accuracy(preds, yb))
''',
]

FIT = '''
from IPython.core.debugger import set_trace

lr = 0.5  # learning rate
epochs = 2  # how many epochs to train for

for epoch in range(epochs):
    for i in range((n - 1) // bs + 1):
        #         set_trace()
        start_i = i * bs
        end_i = start_i + bs
        xb = x_train[start_i:end_i]
        yb = y_train[start_i:end_i]
        pred = model(xb)
        loss = loss_func(pred, yb)

        loss.backward()
        with torch.no_grad():
            weights -= weights.grad * lr
            bias -= bias.grad * lr
            weights.grad.zero_()
            bias.grad.zero_()
'''

SHARD = None    # the loop slices x_train by the notebook's n: every rank reads all the data
RETURN = "weights,bias"
SEED = 0
JUDGE = "single"


def progress(ns, objs):
    import torch

    def loss(w, b):
        out = ns["x_train"] @ w + b
        return float(torch.nn.functional.cross_entropy(out, ns["y_train"]))

    with torch.no_grad():
        return loss(ns["weights"], ns["bias"]), loss(objs["weights"], objs["bias"])
