"""The cluster layer's error, in a module of its own so that any module of the layer can raise
it without importing another (a leaf: it imports nothing from phalanx)."""


class ClusterError(RuntimeError):
    """A cluster request that cannot be carried out; the message says what to do instead."""
