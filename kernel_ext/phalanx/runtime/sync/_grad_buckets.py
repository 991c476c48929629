"""The flat buckets gradients are averaged in: which parameters, and where each one sits.

A :class:`BucketLayout` is built for one set of parameters and kept between backward passes (it
is rebuilt only when the set changes: ``add_param_group``, ``requires_grad`` switched), as DDP's
reducer keeps its buckets: a pass then costs copies into tensors allocated once.

Parameters go into buckets in *reverse* order, last layer first, because the backward pass
produces their gradients roughly in that order: the first bucket is the first to fill, so its
averaging can start while the earlier layers' gradients are still being computed.  A bucket holds
parameters of one dtype and device, at most ``BUCKET_BYTES``; DDP uses the same 25 MB.

Example::

    >>> import torch
    >>> a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    >>> layout = BucketLayout([("s", [a, b])], bucket_bytes=8)
    >>> [len(bk.params) for bk in layout.buckets], layout.buckets[0].params[0] is b
    ([1, 1], True)
    >>> b.grad = torch.full((3,), 2.0)
    >>> layout.buckets[0].fill(0, suppressed=set()); layout.buckets[0].flat.tolist()
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

from typing import Any, Container, Sequence

from ...wire._options import TrainOptions

BUCKET_BYTES = TrainOptions().bucket_bytes  # --bucket-mb's default


class Bucket:
    """Some parameters' gradients in one flat tensor: filled, reduced, written back."""

    def __init__(self, owner: int, params: list) -> None:
        import torch

        self.owner = owner          # index of the (strategy, params) group it belongs to
        self.params = params
        self.offsets = []
        at = 0
        for p in params:
            self.offsets.append(at)
            at += p.numel()
        first = params[0]
        self.flat = torch.zeros(at, dtype=first.dtype, device=first.device)
        self.filled = [False] * len(params)
        self.count = 0              # parameters filled in this pass

    def fill(self, i: int, suppressed: Container[int]) -> None:
        """Copy parameter ``i``'s gradient in (zeros where it has none or ``no_sync`` keeps it)."""
        p, at = self.params[i], self.offsets[i]
        view = self.flat[at:at + p.numel()]
        grad = p.grad
        if grad is None or id(p) in suppressed:
            view.zero_()
        elif grad.is_sparse:
            raise TypeError(f"sparse gradients (a parameter of shape {tuple(p.shape)}) are "
                            "not averaged by zero-change mode: use wrap(model) (DDP)")
        else:
            view.copy_(grad.reshape(-1))
        if not self.filled[i]:
            self.filled[i] = True
            self.count += 1

    def fill_rest(self, suppressed: Container[int]) -> None:
        """Fill the parameters whose gradient hook did not fire in this pass."""
        for i, done in enumerate(self.filled):
            if not done:
                self.fill(i, suppressed)

    @property
    def full(self) -> bool:
        return self.count == len(self.params)

    def zero(self) -> None:
        """A joined rank's contribution: nothing."""
        self.flat.zero_()

    def write_back(self, scale: float | None, keep: Container[int]) -> None:
        """Averages into ``.grad``, except for parameters in ``keep`` (``no_sync``, unused)."""
        if scale is not None:
            self.flat.mul_(scale)
        for p, at in zip(self.params, self.offsets):
            if id(p) in keep:
                continue
            value = self.flat[at:at + p.numel()].view(p.shape)
            if p.grad is None:
                p.grad = value.clone()  # the flat tensor is reused by the next pass
            else:
                p.grad.copy_(value)

    def reset(self) -> None:
        self.filled = [False] * len(self.params)
        self.count = 0


class BucketLayout:
    """Every group's parameters in buckets, in the order they are reduced on every rank."""

    def __init__(self, groups: Sequence[tuple[Any, list]],
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        self.params: list = []      # every parameter once, in the order of the groups
        self.buckets: list[Bucket] = []
        self.where: dict[int, tuple[int, int]] = {}   # id(param) -> (bucket index, slot)
        for owner, (_strategy, params) in enumerate(groups):
            self.params.extend(params)
            for chunk in _chunks(list(reversed(params)), bucket_bytes):
                for slot, p in enumerate(chunk):
                    self.where[id(p)] = (len(self.buckets), slot)
                self.buckets.append(Bucket(owner, chunk))
        self.key = [id(p) for p in self.params]

    def reset(self) -> None:
        for bucket in self.buckets:
            bucket.reset()

    def moved(self) -> bool:
        """Whether the parameters changed dtype or device since (``model.half()``, ``.to()``:
        all of a module's parameters move together, so each bucket's first one tells)."""
        return any((b.params[0].dtype, b.params[0].device) != (b.flat.dtype, b.flat.device)
                   for b in self.buckets)


def _chunks(params: list, limit: int) -> list[list]:
    """Consecutive parameters of one (dtype, device), at most ``limit`` bytes per chunk."""
    chunks: list[list] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        last = chunks[-1] if chunks else None
        if last is None or (last[0].dtype, last[0].device) != (p.dtype, p.device) \
                or size + nbytes > limit:
            chunks.append([p])
            size = nbytes
        else:
            last.append(p)
            size += nbytes
    return chunks
