"""PyTorch "Learn the Basics: Quickstart", laid out as the tutorial's code blocks.

Source: pytorch/tutorials beginner_source/basics/quickstart_tutorial.py
commit afcd669d56554c2ef46f2da92edbfaf8c54043ec, BSD-3-Clause.

Shape: multi-cell; the ``optimizer`` is built in an earlier cell than the loop (as the tutorial
does), ``train``/``test`` are notebook functions taking everything as arguments.

Replaced: ``from torchvision import datasets`` / ``ToTensor`` (torchvision is not installed) and
the two ``datasets.FashionMNIST(..., download=True)`` downloads, by 256 training and 64 test
generated 1x28x28 images in [0, 1) labelled by a fixed random linear teacher (a TensorDataset
yields the same (image, label) pairs).  Sizes: 60000/10000 images -> 256/64.  The cells after the
loop (saving, loading, predicting) are left out.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/basics/quickstart_tutorial.py",
          "commit": "afcd669d56554c2ef46f2da92edbfaf8c54043ec", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "optimizer (built in an earlier cell)"}

CELLS = [
    '''
import torch
from torch import nn
from torch.utils.data import DataLoader
# REPLACED: from torchvision import datasets; from torchvision.transforms import ToTensor
from torch.utils.data import TensorDataset
''',
    '''
# REPLACED: training_data = datasets.FashionMNIST(root="data", train=True, download=True,
#           transform=ToTensor()); test_data = datasets.FashionMNIST(..., train=False, ...)
_teacher = torch.randn(28 * 28, 10)
_images = torch.rand(256 + 64, 1, 28, 28)
_labels = ((_images - 0.5).flatten(1) @ _teacher).argmax(1)
training_data = TensorDataset(_images[:256], _labels[:256])
test_data = TensorDataset(_images[256:], _labels[256:])
''',
    '''
batch_size = 64

# Create data loaders.
train_dataloader = DataLoader(training_data, batch_size=batch_size)
test_dataloader = DataLoader(test_data, batch_size=batch_size)

for X, y in test_dataloader:
    print(f"Shape of X [N, C, H, W]: {X.shape}")
    print(f"Shape of y: {y.shape} {y.dtype}")
    break
''',
    '''
# Get cpu, gpu or mps device for training.
device = (
    "cuda"
    if torch.cuda.is_available()
    else "mps"
    if torch.backends.mps.is_available()
    else "cpu"
)
print(f"Using {device} device")

# Define model
class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28*28, 512),
            nn.ReLU(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, 10)
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits

model = NeuralNetwork().to(device)
print(model)
''',
    '''
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
''',
    '''
def train(dataloader, model, loss_fn, optimizer):
    size = len(dataloader.dataset)
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        X, y = X.to(device), y.to(device)

        # Compute prediction error
        pred = model(X)
        loss = loss_fn(pred, y)

        # Backpropagation
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

        if batch % 100 == 0:
            loss, current = loss.item(), (batch + 1) * len(X)
            print(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]")
''',
    '''
def test(dataloader, model, loss_fn):
    size = len(dataloader.dataset)
    num_batches = len(dataloader)
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for X, y in dataloader:
            X, y = X.to(device), y.to(device)
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    test_loss /= num_batches
    correct /= size
    print(f"Test Error: \\n Accuracy: {(100*correct):>0.1f}%, Avg loss: {test_loss:>8f} \\n")
''',
]

FIT = '''
epochs = 5
for t in range(epochs):
    print(f"Epoch {t+1}\\n-------------------------------")
    train(train_dataloader, model, loss_fn, optimizer)
    test(test_dataloader, model, loss_fn)
print("Done!")
'''

SHARD = None          # the DataLoader is built in the notebook: every rank reads all the data
RETURN = "model"
SEED = 0
JUDGE = "single"      # no shuffling, no dropout: the ranks' average is the one-process gradient


def progress(ns, objs):
    import torch

    X, y = ns["training_data"].tensors
    with torch.no_grad():
        return (float(ns["loss_fn"](ns["model"](X), y)), float(ns["loss_fn"](objs["model"](X), y)))
