"""PyTorch "Introduction to PyTorch on YouTube: Training with PyTorch": ``GarmentClassifier``,
an SGD optimizer with momentum in its own cell, a notebook function ``train_one_epoch(epoch_index,
tb_writer)`` that reads ``training_loader``, ``optimizer``, ``model`` and ``loss_fn`` as notebook
globals, and the per-epoch cell (validation, TensorBoard scalars, best model saved) as the fit
cell.

Source: pytorch/tutorials beginner_source/introyt/trainingyt.py
commit 0ac2837909020020424e9d71fea433db9d6f5e13, BSD-3-Clause.

Shape: multi-cell, the tutorial's code blocks; optimizer built in an earlier cell and used by a
function that takes no model/optimizer arguments; the training loader shuffles, with 2 worker
processes, as written.

Replaced: ``import torchvision`` / ``torchvision.transforms`` (not installed) and the two
``torchvision.datasets.FashionMNIST('./data', ..., download=True)`` by TensorDatasets of
generated 1x28x28 images normalised to [-1, 1] as the tutorial's transform does, labelled by a
fixed random linear teacher; ``from torch.utils.tensorboard import SummaryWriter`` (tensorboard
is not installed; it writes event files under runs/) by a class with the same methods that
records nothing; the saved model's path ``'model_{}_{}'`` (the working directory) by the same
name in the harness's scratch directory ``CORPUS_SCRATCH``.  The cell that shows images is left out.  Sizes: 60000/10000
images -> 96/16, 5 epochs -> 2.

Judged against ``wrap()``: the training loader's shuffled order is drawn per rank.  The
``wrap()`` run starts with ``model = wrap(model)``.
"""

SOURCE = {"repo": "pytorch/tutorials", "path": "beginner_source/introyt/trainingyt.py",
          "commit": "0ac2837909020020424e9d71fea433db9d6f5e13", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "optimizer (SGD momentum, earlier cell, used by a global-reading function)"}

CELLS = [
    '''
import torch
# REPLACED: import torchvision; import torchvision.transforms as transforms   (not installed)

# PyTorch TensorBoard support
# REPLACED: from torch.utils.tensorboard import SummaryWriter   (tensorboard is not installed)
class SummaryWriter:
    def __init__(self, log_dir=None):
        self.log_dir = log_dir
    def add_scalar(self, *args, **kwargs):
        pass
    def add_scalars(self, *args, **kwargs):
        pass
    def flush(self):
        pass
from datetime import datetime


# REPLACED: transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])
# Create datasets for training & validation, download if necessary
# REPLACED: torchvision.datasets.FashionMNIST('./data', train=True/False, transform=transform, download=True)
_teacher = torch.randn(28 * 28, 10)
_images = torch.rand(96 + 16, 1, 28, 28) * 2 - 1
_labels = (_images.flatten(1) @ _teacher).argmax(1)
training_set = torch.utils.data.TensorDataset(_images[:96], _labels[:96])
validation_set = torch.utils.data.TensorDataset(_images[96:], _labels[96:])

# Create data loaders for our datasets; shuffle for training, not for validation
training_loader = torch.utils.data.DataLoader(training_set, batch_size=4, shuffle=True, num_workers=2)
validation_loader = torch.utils.data.DataLoader(validation_set, batch_size=4, shuffle=False, num_workers=2)

# Class labels
classes = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat',
        'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle Boot')

# Report split sizes
print('Training set has {} instances'.format(len(training_set)))
print('Validation set has {} instances'.format(len(validation_set)))
''',
    '''
import torch.nn as nn
import torch.nn.functional as F

# PyTorch models inherit from torch.nn.Module
class GarmentClassifier(nn.Module):
    def __init__(self):
        super(GarmentClassifier, self).__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = self.fc3(x)
        return x
    

model = GarmentClassifier()
''',
    '''
loss_fn = torch.nn.CrossEntropyLoss()

# NB: Loss functions expect data in batches, so we're creating batches of 4
# Represents the model's confidence in each of the 10 classes for a given input
dummy_outputs = torch.rand(4, 10)
# Represents the correct class among the 10 being tested
dummy_labels = torch.tensor([1, 5, 3, 7])
    
print(dummy_outputs)
print(dummy_labels)

loss = loss_fn(dummy_outputs, dummy_labels)
print('Total loss for this batch: {}'.format(loss.item()))
''',
    '''
# Optimizers specified in the torch.optim package
optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
''',
    '''
def train_one_epoch(epoch_index, tb_writer):
    running_loss = 0.
    last_loss = 0.
    
    # Here, we use enumerate(training_loader) instead of
    # iter(training_loader) so that we can track the batch
    # index and do some intra-epoch reporting
    for i, data in enumerate(training_loader):
        # Every data instance is an input + label pair
        inputs, labels = data
        
        # Zero your gradients for every batch!
        optimizer.zero_grad()
        
        # Make predictions for this batch
        outputs = model(inputs)
        
        # Compute the loss and its gradients
        loss = loss_fn(outputs, labels)
        loss.backward()
        
        # Adjust learning weights
        optimizer.step()
        
        # Gather data and report
        running_loss += loss.item()
        if i % 1000 == 999:
            last_loss = running_loss / 1000 # loss per batch
            print('  batch {} loss: {}'.format(i + 1, last_loss))
            tb_x = epoch_index * len(training_loader) + i + 1
            tb_writer.add_scalar('Loss/train', last_loss, tb_x)
            running_loss = 0.
            
    return last_loss
''',
]

FIT = '''
# Initializing in a separate cell so we can easily add more epochs to the same run
timestamp = datetime.now().strftime('%Y%m%d_%H%M%S')
writer = SummaryWriter('runs/fashion_trainer_{}'.format(timestamp))
epoch_number = 0

EPOCHS = 2  # SIZE: 5

best_vloss = 1_000_000.

for epoch in range(EPOCHS):
    print('EPOCH {}:'.format(epoch_number + 1))
    
    # Make sure gradient tracking is on, and do a pass over the data
    model.train(True)
    avg_loss = train_one_epoch(epoch_number, writer)
    
    # We don't need gradients on to do reporting
    model.train(False)
    
    running_vloss = 0.0
    for i, vdata in enumerate(validation_loader):
        vinputs, vlabels = vdata
        voutputs = model(vinputs)
        vloss = loss_fn(voutputs, vlabels)
        running_vloss += vloss
    
    avg_vloss = running_vloss / (i + 1)
    print('LOSS train {} valid {}'.format(avg_loss, avg_vloss))
    
    # Log the running loss averaged per batch
    # for both training and validation
    writer.add_scalars('Training vs. Validation Loss',
                    { 'Training' : avg_loss, 'Validation' : avg_vloss },
                    epoch_number + 1)
    writer.flush()
    
    # Track best performance, and save the model's state
    if avg_vloss < best_vloss:
        best_vloss = avg_vloss
        # REPLACED: model_path = 'model_{}_{}'.format(timestamp, epoch_number)   (the working directory)
        import os
        model_path = os.path.join(CORPUS_SCRATCH, 'model_{}_{}'.format(timestamp, epoch_number))
        torch.save(model.state_dict(), model_path)
    
    epoch_number += 1
'''

SHARD = None   # the loaders are built in the notebook: every rank reads all the data
RETURN = "model"
SEED = 0
JUDGE = "wrap"
WRAP = [(None, "model = wrap(model)")]


def progress(ns, objs):
    import torch

    X, y = ns["training_set"].tensors
    with torch.no_grad():
        return float(ns["loss_fn"](ns["model"](X), y)), float(ns["loss_fn"](objs["model"](X), y))
