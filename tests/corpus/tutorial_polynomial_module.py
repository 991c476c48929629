"""PyTorch "Learning PyTorch with Examples": Custom nn Modules (``Polynomial3``, a Module class
defined in the cell, trained with ``torch.optim.SGD``).

Source: pytorch/tutorials beginner_source/examples_nn/polynomial_module.py
commit 1d189709801e98f5f184af0567c7f06b8b5156c2, BSD-3-Clause.

Shape: single-cell (the whole script, class included, in the fit cell); optimizer built in the
cell, ``MSELoss(reduction='sum')``.

Replaced: nothing but the size: 2000 -> 500 iterations.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/examples_nn/polynomial_module.py",
          "commit": "1d189709801e98f5f184af0567c7f06b8b5156c2", "license": "BSD-3-Clause",
          "shape": "single-cell", "update": "optimizer (SGD, custom Module class in the cell)"}

CELLS = []

FIT = '''
import torch
import math


class Polynomial3(torch.nn.Module):
    def __init__(self):
        """
        In the constructor we instantiate four parameters and assign them as
        member parameters.
        """
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(()))
        self.b = torch.nn.Parameter(torch.randn(()))
        self.c = torch.nn.Parameter(torch.randn(()))
        self.d = torch.nn.Parameter(torch.randn(()))

    def forward(self, x):
        """
        In the forward function we accept a Tensor of input data and we must return
        a Tensor of output data. We can use Modules defined in the constructor as
        well as arbitrary operators on Tensors.
        """
        return self.a + self.b * x + self.c * x ** 2 + self.d * x ** 3

    def string(self):
        """
        Just like any class in Python, you can also define custom method on PyTorch modules
        """
        return f'y = {self.a.item()} + {self.b.item()} x + {self.c.item()} x^2 + {self.d.item()} x^3'


# Create Tensors to hold input and outputs.
x = torch.linspace(-math.pi, math.pi, 2000)
y = torch.sin(x)

# Construct our model by instantiating the class defined above
model = Polynomial3()

# Construct our loss function and an Optimizer. The call to model.parameters()
# in the SGD constructor will contain the learnable parameters (defined 
# with torch.nn.Parameter) which are members of the model.
criterion = torch.nn.MSELoss(reduction='sum')
optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
for t in range(500):  # SIZE: 2000 -> 500 iterations
    # Forward pass: Compute predicted y by passing x to the model
    y_pred = model(x)

    # Compute and print loss
    loss = criterion(y_pred, y)
    if t % 100 == 99:
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
JUDGE = "single"


def progress(ns, objs):
    import math

    import torch

    x = torch.linspace(-math.pi, math.pi, 2000)
    y = torch.sin(x)
    torch.manual_seed(0)  # rank 0's draw: a, b, c, d in that order
    a, b, c, d = (torch.randn(()) for _ in range(4))
    with torch.no_grad():
        return (float((a + b * x + c * x ** 2 + d * x ** 3 - y).pow(2).sum()),
                float((objs["model"](x) - y).pow(2).sum()))
