"""PyTorch "Learning PyTorch with Examples": Tensors and autograd (third-order polynomial fit to
sin(x) with raw tensors ``a, b, c, d`` and a hand-written gradient-descent update).

Source: pytorch/tutorials beginner_source/examples_autograd/polynomial_autograd.py
commit 92f11a171bb3f3f6bbd8dfb102c59d67c2385032, BSD-3-Clause.  (The index's newest version,
02e5a75d, resets the gradients with ``a.grad = 0.``, which torch 2.13 refuses in one process
too; this is the version before it.)

Shape: single-cell (the whole script pasted into the fit cell); manual update on raw tensors, no
torch optimizer, sum-of-squares loss.  The weights are drawn with ``torch.randn`` inside the cell,
so each rank draws its own (``--seed`` seeds rank r with seed + r).

Replaced: nothing but the size: 2000 -> 500 iterations.
"""

SOURCE = {"repo": "pytorch/tutorials",
          "path": "beginner_source/examples_autograd/polynomial_autograd.py",
          "commit": "92f11a171bb3f3f6bbd8dfb102c59d67c2385032", "license": "BSD-3-Clause",
          "shape": "single-cell", "update": "manual (raw tensors)"}

CELLS = []

FIT = '''
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
# The weights are drawn with torch.randn in the cell, under --seed 0 as seed + rank: each rank
# starts from other values, and its first forward pass already used them, so no averaging can
# make the first step right.  phalanx refuses the run at that first backward, naming them (a
# tensor built in an earlier cell, or a module's parameter, trains exactly).
JUDGE = "refused"
REFUSED = r"DivergentLeafError.*a, b, c are trained in this backward pass but held different values"


def progress(ns, objs):
    import math

    import torch

    x = torch.linspace(-math.pi, math.pi, 2000)
    y = torch.sin(x)

    def loss(a, b, c, d):
        return float((a + b * x + c * x ** 2 + d * x ** 3 - y).pow(2).sum())

    torch.manual_seed(0)  # rank 0's draw
    start = [torch.randn(()) for _ in range(4)]
    with torch.no_grad():
        return loss(*start), loss(*(objs[k] for k in "abcd"))
