"""The small model and data every throughput benchmark trains (the same bytes everywhere)."""

import torch


def make_mlp(inputs: int = 64, hidden: int = 256, classes: int = 10) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, classes))


def make_data(rows: int, inputs: int = 64, classes: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(rows, inputs, generator=g)
    y = torch.randint(0, classes, (rows,), generator=g)
    return X, y
