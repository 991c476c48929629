"""PyTorch "Learning PyTorch with Examples": Control Flow + Weight Sharing (``DynamicNet``: each
forward pass picks 4 or 5 orders with ``random.randint`` and reuses the parameter ``e`` for them;
SGD with momentum).

Source: pytorch/tutorials beginner_source/examples_nn/dynamic_net.py
commit 1d189709801e98f5f184af0567c7f06b8b5156c2, BSD-3-Clause.

Shape: single-cell (the whole script in the fit cell); optimizer built in the cell; the graph
changes from step to step, per rank: ``random`` is seeded per rank by ``--seed``, so in a step
one rank may use ``e`` and the other not (a parameter without a gradient on some ranks).

Replaced: nothing but the size: 30000 -> 600 iterations (and the report every 2000 -> every 200).

Judged by agreement and the loss only (``JUDGE = "agree"``): the orders are drawn per rank, so no
single process takes the same steps, and DistributedDataParallel (``wrap()``) refuses a step in
which a parameter gets no gradient unless built with ``find_unused_parameters=True``, which
``wrap()`` does not set.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/examples_nn/dynamic_net.py",
          "commit": "1d189709801e98f5f184af0567c7f06b8b5156c2", "license": "BSD-3-Clause",
          "shape": "single-cell", "update": "optimizer (SGD momentum), dynamic graph, parameter unused on some ranks"}

CELLS = []

FIT = '''
import random
import torch
import math


class DynamicNet(torch.nn.Module):
    def __init__(self):
        """
        In the constructor we instantiate five parameters and assign them as members.
        """
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(()))
        self.b = torch.nn.Parameter(torch.randn(()))
        self.c = torch.nn.Parameter(torch.randn(()))
        self.d = torch.nn.Parameter(torch.randn(()))
        self.e = torch.nn.Parameter(torch.randn(()))

    def forward(self, x):
        """
        For the forward pass of the model, we randomly choose either 4, 5
        and reuse the e parameter to compute the contribution of these orders.

        Since each forward pass builds a dynamic computation graph, we can use normal
        Python control-flow operators like loops or conditional statements when
        defining the forward pass of the model.

        Here we also see that it is perfectly safe to reuse the same parameter many
        times when defining a computational graph.
        """
        y = self.a + self.b * x + self.c * x ** 2 + self.d * x ** 3
        for exp in range(4, random.randint(4, 6)):
            y = y + self.e * x ** exp
        return y

    def string(self):
        """
        Just like any class in Python, you can also define custom method on PyTorch modules
        """
        return f'y = {self.a.item()} + {self.b.item()} x + {self.c.item()} x^2 + {self.d.item()} x^3 + {self.e.item()} x^4 ? + {self.e.item()} x^5 ?'


# Create Tensors to hold input and outputs.
x = torch.linspace(-math.pi, math.pi, 2000)
y = torch.sin(x)

# Construct our model by instantiating the class defined above
model = DynamicNet()

# Construct our loss function and an Optimizer. Training this strange model with
# vanilla stochastic gradient descent is tough, so we use momentum
criterion = torch.nn.MSELoss(reduction='sum')
optimizer = torch.optim.SGD(model.parameters(), lr=1e-8, momentum=0.9)
for t in range(600):  # SIZE: 30000 iterations
    # Forward pass: Compute predicted y by passing x to the model
    y_pred = model(x)

    # Compute and print loss
    loss = criterion(y_pred, y)
    if t % 200 == 199:  # SIZE: every 2000
        print(t, loss.item())

    # Zero gradients, perform a backward pass, and update the weights.
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print(f'Result: {model.string()}')
'''

SHARD = None
RETURN = "model"
SEED = 0
JUDGE = "agree"


def progress(ns, objs):
    """The sum-of-squares loss with the 4th and 5th orders both on, and both off."""
    import math

    import torch

    x = torch.linspace(-math.pi, math.pi, 2000)
    y = torch.sin(x)

    def loss(a, b, c, d, e):
        base = a + b * x + c * x ** 2 + d * x ** 3
        return float((base - y).pow(2).sum() + (base + e * x ** 4 + e * x ** 5 - y).pow(2).sum())

    torch.manual_seed(0)  # rank 0's draw
    start = [torch.randn(()) for _ in range(5)]
    m = objs["model"]
    with torch.no_grad():
        return loss(*start), loss(m.a, m.b, m.c, m.d, m.e)
