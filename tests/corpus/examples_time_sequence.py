"""pytorch/examples "Time Sequence Prediction": two ``LSTMCell``s predicting sine waves, trained
full-batch with ``optim.LBFGS`` and a ``closure`` that runs forward and backward (several times
per ``step``).

Source: pytorch/examples time_sequence_prediction/train.py (data from generate_sine_wave.py)
commit 77f55b912142e11fcfdf5b530231fb9c52f181e8, BSD-3-Clause.

Shape: multi-cell, as a user splits the script: imports and ``Sequence`` in one cell, the
``__main__`` block's set-up and data in notebook cells, its model/optimizer/loop part (from
``# build the model``) in the fit cell.  Closure optimizer built in the fit cell; ``--shard``
splits the training sequences (rows), so each rank's full batch is half the data.

Replaced: ``argparse`` by a namespace with the same field; ``torch.load('traindata.pt')`` by the
array ``generate_sine_wave.py`` writes to that file, computed in the cell (same code,
``np.random.seed(2)``; sizes: N = 100 -> 11 sequences, L = 1000 -> 30 steps); in the loop,
``future = 1000 -> 30`` and the plotting block, which writes a PDF per step
(``plt.savefig('predict%d.pdf'%i)``), is left out.  Steps: 15 -> 2.

The rows are split 4 + 4 (rows 3.. of 11; the first 3 are the test set), each rank's loss is the
mean over its rows, so the averaged gradient is the full-batch gradient: judged against one
process on all 8 rows.
"""

SOURCE = {"repo": "pytorch/examples", "path": "time_sequence_prediction/train.py",
          "commit": "77f55b912142e11fcfdf5b530231fb9c52f181e8", "license": "BSD-3-Clause",
          "shape": "multi-cell", "update": "closure (LBFGS)"}

CELLS = [
    '''
from __future__ import print_function
import argparse
import torch
import torch.nn as nn
import torch.optim as optim
import numpy as np
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt

class Sequence(nn.Module):
    def __init__(self):
        super(Sequence, self).__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input, future = 0):
        outputs = []
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):# if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.cat(outputs, dim=1)
        return outputs
''',
    '''
# REPLACED: parser = argparse.ArgumentParser(); parser.add_argument('--steps', ...); opt = parser.parse_args()
from types import SimpleNamespace
opt = SimpleNamespace(steps=2)
# set random seed to 0
np.random.seed(0)
torch.manual_seed(0)
''',
    '''
# REPLACED: data = torch.load('traindata.pt') by what generate_sine_wave.py writes there:
np.random.seed(2)
T = 20
L = 30   # SIZE: 1000
N = 11   # SIZE: 100
x = np.empty((N, L), 'int64')
x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
data = np.sin(x / 1.0 / T).astype('float64')

# load data and make training set
input = torch.from_numpy(data[3:, :-1])
target = torch.from_numpy(data[3:, 1:])
test_input = torch.from_numpy(data[:3, :-1])
test_target = torch.from_numpy(data[:3, 1:])
''',
]

FIT = '''
# build the model
seq = Sequence()
seq.double()
criterion = nn.MSELoss()
# use LBFGS as optimizer since we can load the whole data to train
optimizer = optim.LBFGS(seq.parameters(), lr=0.8)
#begin to train
for i in range(opt.steps):
    print('STEP: ', i)
    def closure():
        optimizer.zero_grad()
        out = seq(input)
        loss = criterion(out, target)
        print('loss:', loss.item())
        loss.backward()
        return loss
    optimizer.step(closure)
    # begin to predict, no need to track gradient here
    with torch.no_grad():
        future = 30  # SIZE: 1000
        pred = seq(test_input, future=future)
        loss = criterion(pred[:, :-future], test_target)
        print('test loss:', loss.item())
        y = pred.detach().numpy()
    # REPLACED: the plotting block (plt.figure ... plt.savefig('predict%d.pdf'%i); plt.close())
'''

SHARD = "input,target"
RETURN = "seq"
SEED = 0
JUDGE = "single"


def progress(ns, objs):
    import torch

    torch.manual_seed(0)
    start = ns["Sequence"]().double()
    with torch.no_grad():
        return (float(torch.nn.functional.mse_loss(start(ns["input"]), ns["target"])),
                float(torch.nn.functional.mse_loss(objs["seq"](ns["input"]), ns["target"])))
