"""Which optimizer's steps are the run's steps.

A cell may step several optimizers.  The run's step count (each strategy's step index,
the progress, ``--check-every``, commits) follows one of them, the *counting* optimizer:

* the first optimizer attached;
* one attached after the counting one's last step, which steps before that one steps again: a
  new model trained after the last (k-fold, a second phase of fine-tuning).  Before, the run's
  steps stopped at the first model's, and ``localsgd`` kept one step index (averaged at every
  step, or never);
* one that counted before, when it steps twice with no step of the counting one in between.

Optimizers made before the loop and stepped in turn (a GAN's, a critic stepped five times a
generator step) keep the first.  Every rank decides alike: the choice depends only on the order
of attaches and steps.

Example (k-fold: the second fold's optimizer takes over the count)::

    >>> count = StepCount()
    >>> count.attached(1); [count.stepped(1) for _ in range(2)]
    [True, True]
    >>> count.attached(2); count.stepped(2), count.counting
    (True, 2)
    >>> gan = StepCount(); gan.attached("d"); gan.attached("g")
    >>> [gan.stepped(k) for k in "dgdg"]
    [True, False, True, False]
"""

from __future__ import annotations

from typing import Hashable


class StepCount:
    """Tells, at each optimizer step, whether it is one of the run's steps."""

    def __init__(self) -> None:
        self.counting: Hashable | None = None  # the optimizer whose steps count
        self._counted_before: set[Hashable] = set()
        self._serial = 0         # optimizer steps so far, every optimizer's
        self._counting_last = 0  # _serial at the counting optimizer's last step (0: none yet)
        self._born: dict[Hashable, int] = {}   # _serial when each optimizer was attached
        self._last: dict[Hashable, int] = {}   # _serial at each optimizer's last step

    def attached(self, key: Hashable) -> None:
        """Optimizer ``key`` joined the run (the first to join counts)."""
        self._born[key] = self._serial
        if self.counting is None:
            self.counting = key
            self._counted_before.add(key)

    def stepped(self, key: Hashable) -> bool:
        """Optimizer ``key`` took a step: whether it counts as one of the run's."""
        self._serial += 1
        if key != self.counting and self._takes_over(key):
            self.counting = key
            self._counted_before.add(key)
        self._last[key] = self._serial
        if key != self.counting:
            return False
        self._counting_last = self._serial
        return True

    def _takes_over(self, key: Hashable) -> bool:
        last = self._counting_last
        new_phase = 0 < last <= self._born.get(key, 0)
        resumed = key in self._counted_before and last <= self._last.get(key, -1)
        return new_phase or resumed
