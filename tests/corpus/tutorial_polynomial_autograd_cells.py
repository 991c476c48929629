"""PyTorch "Learning PyTorch with Examples": Tensors and autograd, laid out over two notebook
cells: the data and the raw weight tensors ``a, b, c, d`` in one, the hand-written
gradient-descent loop in the fit cell.

Source: pytorch/tutorials beginner_source/examples_autograd/polynomial_autograd.py
commit 92f11a171bb3f3f6bbd8dfb102c59d67c2385032, BSD-3-Clause (the version before the index's
newest, whose ``a.grad = 0.`` torch 2.13 refuses in one process too).

Shape: multi-cell; manual update on raw tensors, no torch optimizer.  Built in the notebook, the
weights arrive the same on every rank, so the loop trains exactly (the single-cell layout,
``tutorial_polynomial_autograd.py``, draws them per rank and is refused).

Replaced: nothing but the size: 2000 -> 500 iterations.
"""

SOURCE = {"repo": "pytorch/tutorials",
          "path": "beginner_source/examples_autograd/polynomial_autograd.py",
          "commit": "92f11a171bb3f3f6bbd8dfb102c59d67c2385032", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "manual (raw tensors)"}

CELLS = ['''
# -*- coding: utf-8 -*-
import torch
import math

dtype = torch.float
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.set_default_device(device)

# Create Tensors to hold input and outputs.
# By default, requires_grad=False, which indicates that we do not need to
# compute gradients with respect to these Tensors during the backward pass.
x = torch.linspace(-math.pi, math.pi, 2000, dtype=dtype)
y = torch.sin(x)

# Create random Tensors for weights. For a third order polynomial, we need
# 4 weights: y = a + b x + c x^2 + d x^3
# Setting requires_grad=True indicates that we want to compute gradients with
# respect to these Tensors during the backward pass.
a = torch.randn((), dtype=dtype, requires_grad=True)
b = torch.randn((), dtype=dtype, requires_grad=True)
c = torch.randn((), dtype=dtype, requires_grad=True)
d = torch.randn((), dtype=dtype, requires_grad=True)

''']

FIT = '''
learning_rate = 1e-6
for t in range(500):  # SIZE: 2000 -> 500 iterations
    # Forward pass: compute predicted y using operations on Tensors.
    y_pred = a + b * x + c * x ** 2 + d * x ** 3

    # Compute and print loss using operations on Tensors.
    # Now loss is a Tensor of shape (1,)
    # loss.item() gets the scalar value held in the loss.
    loss = (y_pred - y).pow(2).sum()
    if t % 100 == 99:
        print(t, loss.item())

    # Use autograd to compute the backward pass. This call will compute the
    # gradient of loss with respect to all Tensors with requires_grad=True.
    # After this call a.grad, b.grad. c.grad and d.grad will be Tensors holding
    # the gradient of the loss with respect to a, b, c, d respectively.
    loss.backward()

    # Manually update weights using gradient descent. Wrap in torch.no_grad()
    # because weights have requires_grad=True, but we don't need to track this
    # in autograd.
    with torch.no_grad():
        a -= learning_rate * a.grad
        b -= learning_rate * b.grad
        c -= learning_rate * c.grad
        d -= learning_rate * d.grad

        # Manually zero the gradients after updating weights
        a.grad = None
        b.grad = None
        c.grad = None
        d.grad = None

print(f'Result: y = {a.item()} + {b.item()} x + {c.item()} x^2 + {d.item()} x^3')
'''

SHARD = None      # the data is made inside the cell: every rank has all of it
RETURN = "a,b,c,d"
SEED = 0
JUDGE = "single"  # the same data and weights on every rank: the average is one process's gradient


def progress(ns, objs):
    import math

    import torch

    x = torch.linspace(-math.pi, math.pi, 2000)
    y = torch.sin(x)

    def loss(a, b, c, d):
        return float((a + b * x + c * x ** 2 + d * x ** 3 - y).pow(2).sum())

    start = [ns[k] for k in "abcd"]  # the notebook's draw
    with torch.no_grad():
        return loss(*start), loss(*(objs[k] for k in "abcd"))
