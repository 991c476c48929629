"""A user strategy for tests/test_loops.py, importable on the engines by its dotted name."""

from phalanx.runtime.sync._strategies import SyncStrategy


class HalfStepAllreduce(SyncStrategy):
    """Averages gradients, then halves them: plain SGD then moves as with half the learning rate."""

    name = "half-step"

    def average_gradients(self, grads, step):
        self.comm.allreduce(grads, op="mean")
        for g in grads:
            g.mul_(0.5)
