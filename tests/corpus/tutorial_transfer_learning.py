"""PyTorch "Transfer Learning for Computer Vision", scenario 1, "ConvNet as fixed feature
extractor": every parameter of the network frozen (``requires_grad = False``) but a new ``fc``,
``optimizer_conv = optim.SGD(model_conv.fc.parameters(), ...)`` and a ``StepLR`` scheduler in an
earlier cell, and ``train_model(model, criterion, optimizer, scheduler, num_epochs)`` (train and
val phases, ``torch.set_grad_enabled``, the best weights kept with ``copy.deepcopy`` and loaded
back at the end) called by the fit cell.

Source: pytorch/tutorials beginner_source/transfer_learning_tutorial.py
commit 039ee0ead6a2b72669cc75bee113f8b009e86a8c, BSD-3-Clause.

Shape: multi-cell, the tutorial's code blocks; optimizer over a sub-module's parameters and its
scheduler built in an earlier cell; frozen BatchNorm trunk (its running statistics still move in
train mode); the training loader shuffles.

Replaced: torchvision (not installed): ``datasets.ImageFolder('data/cubsub/...')`` (image files)
by TensorDatasets of generated 3x32x32 images with a ``classes`` list (noise plus a colour per
class), the ``data_transforms`` (crops, flips, normalisation of files) by nothing, and
``torchvision.models.resnet18(pretrained=True)`` (a weights download) by a small plain-torch
network with the same ``.fc`` interface (a conv + BatchNorm trunk, ``fc`` of 8 -> 1000), whose
"pretrained" weights are its seeded initialisation.  The cells that show images
(``imshow``/``visualize_model``) are left out.  Sizes: about 300/100 images of 224x224 ->
64/32 of 32x32, batch size 64 -> 16, ``num_workers`` 4 -> 0, 25 epochs -> 2.

Judged against ``wrap()``: the training loader's order is drawn per rank (and BatchNorm's
running statistics follow rank 0, as under DistributedDataParallel).  The ``wrap()`` run starts
with ``model_conv = wrap(model_conv)``.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/transfer_learning_tutorial.py",
          "commit": "039ee0ead6a2b72669cc75bee113f8b009e86a8c", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "optimizer (on model.fc only, + StepLR, earlier cell), frozen trunk"}

CELLS = [
    '''
# License: BSD
# Author: Sasank Chilamkurthy and Kaichao You

from __future__ import print_function, division

import torch
import torch.nn as nn
import torch.optim as optim
from torch.optim import lr_scheduler
import numpy as np
# REPLACED: import torchvision; from torchvision import datasets, models, transforms
#           (not installed): plain-torch stand-ins for the parts used below
from types import SimpleNamespace
class _ResNet18(nn.Module):
    """Stands in for torchvision's resnet18: a small trunk and the same ``fc`` attribute."""
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8),
                                   nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8, 1000)
    def forward(self, x):
        return self.fc(self.trunk(x))
torchvision = SimpleNamespace(models=SimpleNamespace(resnet18=lambda pretrained=False: _ResNet18()))
models = torchvision.models
import matplotlib.pyplot as plt
import time
import os
import copy

seed = 0 # set seed for reproducibility
torch.manual_seed(seed)
import random
random.seed(seed)
np.random.seed(seed)

plt.ion()   # interactive mode
''',
    '''
# REPLACED: data_transforms = {'train': transforms.Compose([...]), 'val': transforms.Compose([...])}
# REPLACED: data_dir = 'data/cubsub'; datasets.ImageFolder(os.path.join(data_dir, x), data_transforms[x])
class _ImageFolder(torch.utils.data.TensorDataset):
    classes = ['class%d' % i for i in range(10)]
_labels = torch.randint(0, 10, (64 + 32,))
_images = torch.randn(64 + 32, 3, 32, 32) + 2 * torch.randn(10, 3, 1, 1)[_labels]  # a colour per class
image_datasets = {'train': _ImageFolder(_images[:64], _labels[:64]),
                  'val': _ImageFolder(_images[64:], _labels[64:])}
dataloaders = {x: torch.utils.data.DataLoader(image_datasets[x], batch_size=16,
                                              shuffle=(x == 'train'), num_workers=0)
               for x in ['train', 'val']}
dataset_sizes = {x: len(image_datasets[x]) for x in ['train', 'val']}
class_names = image_datasets['train'].classes

device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
''',
    '''
def train_model(model, criterion, optimizer, scheduler, num_epochs=25):
    since = time.time()

    best_model_wts = copy.deepcopy(model.state_dict())
    best_acc = 0.0

    for epoch in range(num_epochs):
        print('Epoch {}/{}'.format(epoch, num_epochs - 1))
        print('-' * 10)

        # Each epoch has a training and validation phase
        for phase in ['train', 'val']:
            if phase == 'train':
                model.train()  # Set model to training mode
            else:
                model.eval()   # Set model to evaluate mode

            running_loss = 0.0
            running_corrects = 0

            # Iterate over data.
            for inputs, labels in dataloaders[phase]:
                inputs = inputs.to(device)
                labels = labels.to(device)

                # zero the parameter gradients
                optimizer.zero_grad()

                # forward
                # compute gradients if only in train
                with torch.set_grad_enabled(phase == 'train'):
                    outputs = model(inputs)
                    target_outputs = outputs[1] if isinstance(outputs, tuple) else outputs
                    _, preds = torch.max(target_outputs, 1)
                    loss = criterion(outputs, labels)

                    # backward + optimize only if in training phase
                    if phase == 'train':
                        loss.backward()
                        optimizer.step()

                # statistics
                running_loss += loss.item() * inputs.size(0)
                running_corrects += torch.sum(preds == labels.data)
            if phase == 'train':
                scheduler.step()

            epoch_loss = running_loss / dataset_sizes[phase]
            epoch_acc = running_corrects.double() / dataset_sizes[phase]

            print('{} Loss: {:.4f} Acc: {:.4f}'.format(
                phase, epoch_loss, epoch_acc))

            # deep copy the model
            if phase == 'val' and epoch_acc > best_acc:
                best_acc = epoch_acc
                best_model_wts = copy.deepcopy(model.state_dict())

        print()

    time_elapsed = time.time() - since
    print('Training complete in {:.0f}m {:.0f}s'.format(
        time_elapsed // 60, time_elapsed % 60))
    print('Best val Acc: {:4f}'.format(best_acc))

    # load best model weights
    model.load_state_dict(best_model_wts)
    return model
''',
    '''
model_conv = torchvision.models.resnet18(pretrained=True)
for param in model_conv.parameters():
    param.requires_grad = False

# Parameters of newly constructed modules have requires_grad=True by default
num_ftrs = model_conv.fc.in_features
model_conv.fc = nn.Linear(num_ftrs, len(class_names))

model_conv = model_conv.to(device)

criterion = nn.CrossEntropyLoss()

# Observe that only parameters of final layer are being optimized as
# opposed to before.
optimizer_conv = optim.SGD(model_conv.fc.parameters(), lr=0.01, momentum=0.9)

# Decay LR by a factor of 0.1 every 7 epochs
exp_lr_scheduler = lr_scheduler.StepLR(optimizer_conv, step_size=7, gamma=0.1)
''',
]

FIT = '''
model_conv = train_model(model_conv, criterion, optimizer_conv,
                         exp_lr_scheduler, num_epochs=2)  # SIZE: 25
'''

SHARD = None   # the loaders are built in the notebook: every rank reads all the data
RETURN = "model_conv"
SEED = 0
JUDGE = "wrap"
WRAP = [(None, "model_conv = wrap(model_conv)")]


def progress(ns, objs):
    """Training loss with batch statistics (train mode, on copies: the running statistics of
    the untrained network are still BatchNorm's initial ones)."""
    import copy

    import torch

    X, y = ns["image_datasets"]["train"].tensors
    with torch.no_grad():
        return (float(ns["criterion"](copy.deepcopy(ns["model_conv"]).train()(X), y)),
                float(ns["criterion"](copy.deepcopy(objs["model_conv"]).train()(X), y)))
