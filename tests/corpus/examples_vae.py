"""pytorch/examples "Basic VAE Example": ``VAE`` with the reparameterisation trick, an Adam
optimizer built next to the model, and notebook functions ``train(epoch)``/``test(epoch)`` that
read ``model``, ``optimizer``, ``train_loader``, ``args`` as notebook globals; the fit cell is
the script's ``if __name__ == "__main__":`` block.

Source: pytorch/examples vae/main.py
commit 77f55b912142e11fcfdf5b530231fb9c52f181e8, BSD-3-Clause.

Shape: multi-cell, as a user splits the script: set-up, data, model + optimizer, loss, train,
test, and the main block as the fit cell (kept with its ``__name__`` guard, which is true in a
notebook).  Optimizer built in an earlier cell; the functions take no model/optimizer arguments;
shuffled loader and ``randn_like`` noise, both per rank.

Replaced: ``argparse`` by a namespace with the same fields (``--no-accel`` set, the sizes below);
``from torchvision import datasets, transforms`` and the two ``datasets.MNIST(..., download=True)``
loaders' datasets by a TensorDataset of generated 1x28x28 images in (0, 1) (a sigmoid of a random
rank-5 pattern, so there is something to learn; labels unused as in the example);
``from torchvision.utils import save_image`` (not installed; it writes PNG files) by a function
that does nothing.  Sizes: 60000/10000 images -> 128/64, batch size 128 -> 32, 10 epochs -> 2.

Judged against ``wrap()`` (the loader shuffles and the noise is drawn per rank).  The ``wrap()``
run needs two edits: ``model = wrap(model)`` first, and ``model.decode`` -> ``model.module.decode``
(DistributedDataParallel does not forward other methods).
"""

SOURCE = {"repo": "pytorch/examples", "path": "vae/main.py",
          "commit": "77f55b912142e11fcfdf5b530231fb9c52f181e8", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "optimizer (built in an earlier cell, used by a global-reading function)"}

CELLS = [
    '''
from __future__ import print_function
import argparse
import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F
# REPLACED: from torchvision import datasets, transforms   (torchvision is not installed)
# REPLACED: from torchvision.utils import save_image       (writes PNG files): does nothing here
def save_image(*args, **kwargs):
    pass


# REPLACED: parser = argparse.ArgumentParser(description='VAE MNIST Example') ...
#           args = parser.parse_args()
from types import SimpleNamespace
args = SimpleNamespace(batch_size=32, epochs=2, no_accel=True, seed=1, log_interval=10)

use_accel = not args.no_accel and torch.accelerator.is_available()

torch.manual_seed(args.seed)


if use_accel:
    device = torch.accelerator.current_accelerator()
else:
    device = torch.device("cpu")

print(f"Using device: {device}")
''',
    '''
kwargs = {'num_workers': 1, 'pin_memory': True} if use_accel else {}
# REPLACED: datasets.MNIST('../data', train=True, download=True, transform=transforms.ToTensor())
#           and datasets.MNIST('../data', train=False, transform=transforms.ToTensor())
_images = torch.sigmoid(2 * torch.randn(128 + 64, 5) @ torch.randn(5, 784)).view(-1, 1, 28, 28)
_train_set = torch.utils.data.TensorDataset(_images[:128], torch.zeros(128, dtype=torch.long))
_test_set = torch.utils.data.TensorDataset(_images[128:], torch.zeros(64, dtype=torch.long))
train_loader = torch.utils.data.DataLoader(
    _train_set,
    batch_size=args.batch_size, shuffle=True, **kwargs)
test_loader = torch.utils.data.DataLoader(
    _test_set,
    batch_size=args.batch_size, shuffle=False, **kwargs)
''',
    '''
class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()

        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5*logvar)
        eps = torch.randn_like(std)
        return mu + eps*std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE().to(device)
optimizer = optim.Adam(model.parameters(), lr=1e-3)
''',
    '''
# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')

    # see Appendix B from VAE paper:
    # Kingma and Welling. Auto-Encoding Variational Bayes. ICLR, 2014
    # https://arxiv.org/abs/1312.6114
    # 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2)
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    return BCE + KLD
''',
    '''
def train(epoch):
    model.train()
    train_loss = 0
    for batch_idx, (data, _) in enumerate(train_loader):
        data = data.to(device)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.item()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader),
                loss.item() / len(data)))

    print('====> Epoch: {} Average loss: {:.4f}'.format(
          epoch, train_loss / len(train_loader.dataset)))
''',
    '''
def test(epoch):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for i, (data, _) in enumerate(test_loader):
            data = data.to(device)
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()
            if i == 0:
                n = min(data.size(0), 8)
                comparison = torch.cat([data[:n],
                                      recon_batch.view(args.batch_size, 1, 28, 28)[:n]])
                save_image(comparison.cpu(),
                         'results/reconstruction_' + str(epoch) + '.png', nrow=n)

    test_loss /= len(test_loader.dataset)
    print('====> Test set loss: {:.4f}'.format(test_loss))
''',
]

FIT = '''
if __name__ == "__main__":
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test(epoch)
        with torch.no_grad():
            sample = torch.randn(64, 20).to(device)
            sample = model.decode(sample).cpu()
            save_image(sample.view(64, 1, 28, 28),
                       'results/sample_' + str(epoch) + '.png')
'''

SHARD = None   # the loaders are built in the notebook: every rank reads all the data
RETURN = "model"
SEED = 0
JUDGE = "wrap"
WRAP = [(None, "model = wrap(model)"),
        ("sample = model.decode(sample).cpu()", "sample = model.module.decode(sample).cpu()")]


def progress(ns, objs):
    """The VAE loss on the training images with z = mu (no sampling noise)."""
    import torch

    x = ns["train_loader"].dataset.tensors[0]

    def loss(model):
        mu, logvar = model.encode(x.view(-1, 784))
        return float(ns["loss_function"](model.decode(mu), x, mu, logvar)) / len(x)

    with torch.no_grad():
        return loss(ns["model"]), loss(objs["model"])
