"""pytorch/examples "Linear regression": fit a degree-4 polynomial with ``nn.Linear`` on random
batches drawn each step, updating the parameters by hand (``param.data.add_(-0.1 * param.grad)``)
until the batch loss is below 1e-3.

Source: pytorch/examples regression/main.py
commit 77f55b912142e11fcfdf5b530231fb9c52f181e8, BSD-3-Clause.

Shape: multi-cell, as a user splits the script: the target polynomial and helper functions in a
notebook cell, the model and its loop (from ``# Define model`` to the end) in the fit cell.
Manual update, no torch optimizer; every step draws its batch with ``torch.randn`` (so each rank
draws its own); the loop stops on the rank's own batch loss.

Replaced: nothing (no data is read; the loop runs to its own stop rule).

Judged by agreement and the loss only (``JUDGE = "agree"``): the batches are drawn per rank, so
no single process sees the same ones, and the stop rule reads each rank's own loss, so the ranks
stop after different numbers of steps and DistributedDataParallel (``wrap()``) cannot run the
loop at all (the rank that stops first leaves the other waiting in its gradient allreduce).
"""

UNEVEN = True  # each rank stops on its own batch loss

SOURCE = {"repo": "pytorch/examples", "path": "regression/main.py",
          "commit": "77f55b912142e11fcfdf5b530231fb9c52f181e8", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "manual (param.data.add_), data-dependent stop"}

CELLS = [
    '''
#!/usr/bin/env python
from __future__ import print_function
from itertools import count

import torch
import torch.nn.functional as F

POLY_DEGREE = 4
W_target = torch.randn(POLY_DEGREE, 1) * 5
b_target = torch.randn(1) * 5


def make_features(x):
    """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE+1)], 1)


def f(x):
    """Approximated function."""
    return x.mm(W_target) + b_target.item()


def poly_desc(W, b):
    """Creates a string description of a polynomial."""
    result = 'y = '
    for i, w in enumerate(W):
        result += '{:+.2f} x^{} '.format(w, i + 1)
    result += '{:+.2f}'.format(b[0])
    return result


def get_batch(batch_size=32):
    """Builds a batch i.e. (x, f(x)) pair."""
    random = torch.randn(batch_size)
    x = make_features(random)
    y = f(x)
    return x, y
''',
]

FIT = '''
# Define model
fc = torch.nn.Linear(W_target.size(0), 1)

for batch_idx in count(1):
    # Get data
    batch_x, batch_y = get_batch()

    # Reset gradients
    fc.zero_grad()

    # Forward pass
    output = F.smooth_l1_loss(fc(batch_x), batch_y)
    loss = output.item()

    # Backward pass
    output.backward()

    # Apply gradients
    for param in fc.parameters():
        param.data.add_(-0.1 * param.grad)

    # Stop criterion
    if loss < 1e-3:
        break

print('Loss: {:.6f} after {} batches'.format(loss, batch_idx))
print('==> Learned function:\\t' + poly_desc(fc.weight.view(-1), fc.bias))
print('==> Actual function:\\t' + poly_desc(W_target.view(-1), b_target))
'''

SHARD = None
RETURN = "fc"
SEED = 0
JUDGE = "agree"


def progress(ns, objs):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(1)
    x, y = ns["get_batch"](1024)
    torch.manual_seed(0)
    start = torch.nn.Linear(ns["W_target"].size(0), 1)
    with torch.no_grad():
        return float(F.smooth_l1_loss(start(x), y)), float(F.smooth_l1_loss(objs["fc"](x), y))
