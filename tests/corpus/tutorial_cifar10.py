"""PyTorch "Deep Learning with PyTorch: A 60 Minute Blitz", "Training a Classifier" (CIFAR10):
``Net`` in one cell, ``criterion`` and ``optimizer = optim.SGD(net.parameters(), lr=0.001,
momentum=0.9)`` in the next, and the training loop over a shuffled ``trainloader`` as the fit
cell.

Source: pytorch/tutorials beginner_source/blitz/cifar10_tutorial.py
commit 04e3d04bcf91d38a1213918eba70dc43e9b0ce45, BSD-3-Clause.

Shape: multi-cell, the tutorial's sections 1-4 (loading, the network, loss and optimizer, the
training loop); optimizer with momentum built in an earlier cell than the loop; the DataLoader
shuffles, with 2 worker processes, as written.

Replaced: ``import torchvision`` / ``torchvision.transforms`` (not installed) and the two
``torchvision.datasets.CIFAR10(root='./data', ..., download=True, transform=transform)`` by
TensorDatasets of generated 3x32x32 images normalised to [-1, 1] as the tutorial's transform does,
labelled by a fixed random linear teacher (``transform`` is not needed any more and is left out).
The cells that display images (``imshow``) and everything after the training loop (testing) are
left out.  Sizes: 50000/10000 images -> 96/16; the loop's own 2 epochs are kept.

Judged against ``wrap()``: the loader's shuffled order is drawn per rank.  The ``wrap()`` run
starts with ``net = wrap(net)``.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/blitz/cifar10_tutorial.py",
          "commit": "04e3d04bcf91d38a1213918eba70dc43e9b0ce45", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "optimizer (SGD momentum, built in an earlier cell)"}

CELLS = [
    '''
import torch
# REPLACED: import torchvision; import torchvision.transforms as transforms   (not installed)
''',
    '''
# REPLACED: transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(...)])
#           trainset = torchvision.datasets.CIFAR10(root='./data', train=True, download=True, transform=transform)
#           testset = torchvision.datasets.CIFAR10(root='./data', train=False, download=True, transform=transform)
_teacher = torch.randn(3 * 32 * 32, 10)
_images = torch.rand(96 + 16, 3, 32, 32) * 2 - 1
_labels = (_images.flatten(1) @ _teacher).argmax(1)
trainset = torch.utils.data.TensorDataset(_images[:96], _labels[:96])
trainloader = torch.utils.data.DataLoader(trainset, batch_size=4,
                                          shuffle=True, num_workers=2)

testset = torch.utils.data.TensorDataset(_images[96:], _labels[96:])
testloader = torch.utils.data.DataLoader(testset, batch_size=4,
                                         shuffle=False, num_workers=2)

classes = ('plane', 'car', 'bird', 'cat',
           'deer', 'dog', 'frog', 'horse', 'ship', 'truck')
''',
    '''
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x


net = Net()
''',
    '''
import torch.optim as optim

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
''',
]

FIT = '''
for epoch in range(2):  # loop over the dataset multiple times

    running_loss = 0.0
    for i, data in enumerate(trainloader, 0):
        # get the inputs; data is a list of [inputs, labels]
        inputs, labels = data

        # zero the parameter gradients
        optimizer.zero_grad()

        # forward + backward + optimize
        outputs = net(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()

        # print statistics
        running_loss += loss.item()
        if i % 2000 == 1999:    # print every 2000 mini-batches
            print('[%d, %5d] loss: %.3f' %
                  (epoch + 1, i + 1, running_loss / 2000))
            running_loss = 0.0

print('Finished Training')
'''

SHARD = None   # the loader is built in the notebook: every rank reads all the data
RETURN = "net"
SEED = 0
JUDGE = "wrap"
WRAP = [(None, "net = wrap(net)")]


def progress(ns, objs):
    import torch

    X, y = ns["trainset"].tensors
    with torch.no_grad():
        return (float(ns["criterion"](ns["net"](X), y)), float(ns["criterion"](objs["net"](X), y)))
