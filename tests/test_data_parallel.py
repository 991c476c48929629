"""Data-parallel nodes: a learning-network machine trained on every engine with distributed fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

import phalanx
from phalanx.network import machine, source

pytestmark = pytest.mark.cluster


class TorchRegressor(RegressorMixin, BaseEstimator):
    """A linear model trained by full-batch gradient descent (so 2 equal shards with gradient
    averaging must give exactly the single-process result)."""

    def __init__(self, epochs: int = 30, lr: float = 0.05):
        self.epochs, self.lr = epochs, lr

    def fit(self, X, y):
        torch.manual_seed(0)
        X, y = torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
        self.net_ = torch.nn.Linear(X.shape[1], 1).double()
        opt = torch.optim.SGD(self.net_.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            opt.zero_grad()
            ((self.net_(X).squeeze(1) - y) ** 2).mean().backward()
            opt.step()
        return self

    def predict(self, X):
        with torch.no_grad():
            return self.net_(torch.as_tensor(X, dtype=torch.float64)).squeeze(1).numpy()


def test_data_parallel_machine_trains_on_every_rank_and_retrains_only_when_needed(two_engines):
    session = two_engines
    rng = np.random.default_rng(0)
    X_data = rng.normal(size=(80, 6))
    y_data = X_data @ rng.normal(size=6) + 0.1
    X, y = source(X_data, name="X"), source(y_data, name="y")
    stand = machine(StandardScaler(), X, name="stand")
    W = stand.transform(X)
    pca = machine(PCA(4), W, name="pca")
    Z = pca.transform(W)
    reg = machine(TorchRegressor(), Z, y, name="dp", fit_runner=phalanx.data_parallel(session=session))
    yhat = reg.predict(Z)

    log = session.fit_network(yhat)
    assert log.actions == {"stand": "fit", "pca": "fit", "dp": "fit"}
    run = session.last_run()
    assert run.world_size == 2 and run.steps == {0: 30, 1: 30} and run.status == "done"

    Zref = PCA(4).fit_transform(StandardScaler().fit_transform(X_data))
    reference = TorchRegressor().fit(Zref, y_data)
    np.testing.assert_allclose(yhat(), reference.predict(Zref), atol=1e-6)

    assert session.fit_network(yhat).actions == {"stand": "skip", "pca": "skip", "dp": "skip"}
    reg.model.set_params(epochs=10)
    assert session.fit_network(yhat).actions == {"stand": "skip", "pca": "skip", "dp": "fit"}
    assert session.last_run().steps == {0: 10, 1: 10}
