"""pytorch/examples "Basic MNIST Example": ``Net`` (two convolutions, two dropouts), notebook
functions ``train(args, model, device, train_loader, optimizer, epoch)`` and ``test(...)``,
Adadelta with a ``StepLR`` schedule; the body of ``main()`` is the fit cell.

Source: pytorch/examples mnist/main.py
commit 77f55b912142e11fcfdf5b530231fb9c52f181e8, BSD-3-Clause.

Shape: multi-cell, as a user splits the script: imports, ``Net``, ``train``, ``test``, the
arguments and the data in notebook cells, ``main()``'s body (unindented) in the fit cell.
Optimizer and scheduler built in the fit cell; dropout in the model; ``--shard`` splits the
training images and labels the cell wraps in its DataLoader.

Replaced: ``argparse`` by a namespace with the same fields (``--no-accel`` set, the sizes
below); ``from torchvision import datasets, transforms`` (not installed) and the two
``datasets.MNIST('../data', ..., download=True, transform=transform)`` by TensorDatasets over
generated 1x28x28 images, normalised as the transform does, with labels from a fixed random
linear teacher (the images are made in a notebook cell so that ``--shard`` can split them).
Sizes: 60000/10000 images -> 64/32, batch size 64 -> 8, 14 epochs -> 2.

Judged against ``wrap()``: dropout draws its masks per rank (and per batch size), so no single
process sees the same ones.
"""

SOURCE = {"repo": "pytorch/examples", "path": "mnist/main.py",
          "commit": "77f55b912142e11fcfdf5b530231fb9c52f181e8", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "optimizer (Adadelta + StepLR, built in the fit cell)"}

CELLS = [
    '''
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
# REPLACED: from torchvision import datasets, transforms   (torchvision is not installed)
from torch.optim.lr_scheduler import StepLR
''',
    '''
class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output
''',
    '''
def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break
''',
    '''
def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print('\\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))
''',
    '''
# REPLACED: parser = argparse.ArgumentParser(description='PyTorch MNIST Example') ...
#           args = parser.parse_args()
from types import SimpleNamespace
args = SimpleNamespace(batch_size=8, test_batch_size=1000, epochs=2, lr=1.0, gamma=0.7,
                       no_accel=True, dry_run=False, seed=1, log_interval=10, save_model=False)

# REPLACED: the MNIST download (datasets.MNIST('../data', train=True, download=True, ...)) and the
# test set, by generated images normalised as transforms.Normalize((0.1307,), (0.3081,)) does.
_teacher = torch.randn(28 * 28, 10)
_images = torch.rand(64 + 32, 1, 28, 28)
_labels = ((_images - 0.5).flatten(1) @ _teacher).argmax(1)
_images = (_images - 0.1307) / 0.3081
X_train, y_train = _images[:64], _labels[:64]
X_test, y_test = _images[64:], _labels[64:]
''',
]

FIT = '''
use_accel = not args.no_accel and torch.accelerator.is_available()

torch.manual_seed(args.seed)

if use_accel:
    device = torch.accelerator.current_accelerator()
else:
    device = torch.device("cpu")

train_kwargs = {'batch_size': args.batch_size}
test_kwargs = {'batch_size': args.test_batch_size}
if use_accel:
    accel_kwargs = {'num_workers': 1,
                    'persistent_workers': True,
                   'pin_memory': True,
                   'shuffle': True}
    train_kwargs.update(accel_kwargs)
    test_kwargs.update(accel_kwargs)

# REPLACED: transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
#           dataset1 = datasets.MNIST('../data', train=True, download=True, transform=transform)
#           dataset2 = datasets.MNIST('../data', train=False, transform=transform)
dataset1 = torch.utils.data.TensorDataset(X_train, y_train)
dataset2 = torch.utils.data.TensorDataset(X_test, y_test)
train_loader = torch.utils.data.DataLoader(dataset1,**train_kwargs)
test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)

model = Net().to(device)
optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
for epoch in range(1, args.epochs + 1):
    train(args, model, device, train_loader, optimizer, epoch)
    test(model, device, test_loader)
    scheduler.step()

if args.save_model:
    torch.save(model.state_dict(), "mnist_cnn.pt")
'''

SHARD = "X_train,y_train"
RETURN = "model"
SEED = 0
JUDGE = "wrap"
WRAP = [("model = Net().to(device)", "model = Net().to(device)\nmodel = wrap(model)")]


def progress(ns, objs):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(ns["args"].seed)  # the fit cell's own seed, then Net()
    start = ns["Net"]().eval()
    model = objs["model"].eval()
    X, y = ns["X_train"], ns["y_train"]
    with torch.no_grad():
        return float(F.nll_loss(start(X), y)), float(F.nll_loss(model(X), y))
