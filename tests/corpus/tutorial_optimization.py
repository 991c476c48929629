"""PyTorch "Learn the Basics: Optimizing Model Parameters", laid out as the tutorial's code blocks.

Source: pytorch/tutorials beginner_source/basics/optimization_tutorial.py
commit 009a87b0ec0b432889e865e55d3ae9e3912c306e, BSD-3-Clause.

Shape: multi-cell; the model is built in the first cell, an optimizer in an earlier cell, and the
last block (the fit cell) builds the loss and a new optimizer itself, then runs the epochs;
``train_loop`` reads the notebook global ``batch_size``.

Replaced: the torchvision imports and the two FashionMNIST downloads by 256/64 generated 1x28x28
images in [0, 1) labelled by a fixed random linear teacher.  Sizes: 60000/10000 -> 256/64 images.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/basics/optimization_tutorial.py",
          "commit": "009a87b0ec0b432889e865e55d3ae9e3912c306e", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "optimizer (built in the fit cell)"}

CELLS = [
    '''
import torch
from torch import nn
from torch.utils.data import DataLoader
# REPLACED: from torchvision import datasets; from torchvision.transforms import ToTensor
from torch.utils.data import TensorDataset

# REPLACED: training_data = datasets.FashionMNIST(root="data", train=True, download=True,
#           transform=ToTensor()); test_data = datasets.FashionMNIST(..., train=False, ...)
_teacher = torch.randn(28 * 28, 10)
_images = torch.rand(256 + 64, 1, 28, 28)
_labels = ((_images - 0.5).flatten(1) @ _teacher).argmax(1)
training_data = TensorDataset(_images[:256], _labels[:256])
test_data = TensorDataset(_images[256:], _labels[256:])

train_dataloader = DataLoader(training_data, batch_size=64)
test_dataloader = DataLoader(test_data, batch_size=64)

class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28*28, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10),
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits

model = NeuralNetwork()
''',
    '''
learning_rate = 1e-3
batch_size = 64
epochs = 5
''',
    '''
# Initialize the loss function
loss_fn = nn.CrossEntropyLoss()
''',
    '''
optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
''',
    '''
def train_loop(dataloader, model, loss_fn, optimizer):
    size = len(dataloader.dataset)
    # Set the model to training mode - important for batch normalization and dropout layers
    # Unnecessary in this situation but added for best practices
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        # Compute prediction and loss
        pred = model(X)
        loss = loss_fn(pred, y)

        # Backpropagation
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if batch % 100 == 0:
            loss, current = loss.item(), batch * batch_size + len(X)
            print(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]")


def test_loop(dataloader, model, loss_fn):
    # Set the model to evaluation mode - important for batch normalization and dropout layers
    # Unnecessary in this situation but added for best practices
    model.eval()
    size = len(dataloader.dataset)
    num_batches = len(dataloader)
    test_loss, correct = 0, 0

    # Evaluating the model with torch.no_grad() ensures that no gradients are computed during test mode
    # also serves to reduce unnecessary gradient computations and memory usage for tensors with requires_grad=True
    with torch.no_grad():
        for X, y in dataloader:
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()

    test_loss /= num_batches
    correct /= size
    print(f"Test Error: \\n Accuracy: {(100*correct):>0.1f}%, Avg loss: {test_loss:>8f} \\n")
''',
]

FIT = '''
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)

epochs = 10
for t in range(epochs):
    print(f"Epoch {t+1}\\n-------------------------------")
    train_loop(train_dataloader, model, loss_fn, optimizer)
    test_loop(test_dataloader, model, loss_fn)
print("Done!")
'''

SHARD = None          # the DataLoader is built in the notebook: every rank reads all the data
RETURN = "model"
SEED = 0
JUDGE = "single"


def progress(ns, objs):
    import torch

    X, y = ns["training_data"].tensors
    with torch.no_grad():
        return (float(ns["loss_fn"](ns["model"](X), y)), float(ns["loss_fn"](objs["model"](X), y)))
