"""Find the modules that hold buffers, and leave every other module's forward pass alone.

Zero-change mode gives every rank rank 0's buffers (BatchNorm running statistics) of the
training modules that hold them (:mod:`._grad_sync`).  There is no wrapper to name those
modules, so they have to be found as the cell runs.  torch's global forward pre-hook sees every
module call, but while one is registered *every* module call takes the slow path of
``Module._call_impl``.  Measured on the 2-core machine, 50-step blocks with and without a no-op
global hook interleaved at random: +40 us a step on the benchmarks' small MLP (4%), +75 us
under DDP.

So the global hook only watches a *discovery window*: from the moment an optimizer whose
gradients phalanx averages is attached (and again when one is added, or a parameter), until the
next optimizer step that followed a forward pass ends.  Modules with buffers
that run in the window are offered to ``on_forward`` as they run (so in forward order).  When
the window closes, the module trees of everything that ran in it, and of the modules the cell's
namespace holds, are walked: each module there with buffers is offered too (a BatchNorm in a
branch taken only later, say), and one that ``on_forward`` does not take yet (in eval mode, for
instance) keeps a forward pre-hook of its own until it does.  The global hook goes, and the other
modules get torch's fast path back.

Two exceptions.  A ``torch.compile``d module traces the hooks into its graph: the hook does
nothing while torch compiles, and it stays registered after the window, since removing it
changes what the compiled graph was guarded on and torch would compile the model again
(measured: a second compile of 0.9 s for a two-layer model).  Inside a compiled graph the hook
costs nothing.  And a module with buffers that first runs after the window, outside all of those
trees (built inside a function, say, and first called late), is not found: the window opens again
for a new optimizer or ``add_param_group``, the ways a new model usually joins a loop.

Example::

    >>> import torch
    >>> offered = []
    >>> watch = ForwardWatch(lambda module, args: offered.append(type(module).__name__) or True)
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    >>> watch.open(); _ = model(torch.ones(3, 2)); watch.step_ended()
    >>> offered, watch.is_open, watch.watched()
    (['BatchNorm1d'], False, 0)
    >>> watch.remove()
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

# A module's forward about to run, with its arguments (None for a module offered, not called):
# True when the callback took it (no need to watch it further)
OnForward = Callable[["torch.nn.Module", "tuple[object, ...] | None"], bool]

# torch warns, at each call of a compiled module while a global hook is registered, that the
# hook fires for the compiled wrapper too.  Here that hook is phalanx's, which expects it.
_COMPILED_WITH_GLOBAL_HOOKS = r"Using `torch\.compile\(module\)` when there are global hooks"


class ForwardWatch:
    """Offers modules that hold buffers to ``on_forward(module, args)`` (``args`` is None when
    offered at the end of the window); it returns True once it needs that module no more."""

    def __init__(self, on_forward: OnForward) -> None:
        self._on_forward = on_forward
        self._global: RemovableHandle | None = None  # the global hook's handle
        self._open = False                # a window is open: look at the trees when it closes
        self._ran = False                 # ... and a module ran since it opened
        self._known: set[int] = set()     # the modules that ran in this window
        self._new: list = []              # ... in the order they first ran
        self._compiled = False            # a torch.compile'd module ran: keep the global hook
        self._hooks: dict[int, RemovableHandle] = {}  # id(module) -> its own hook, until on_forward takes it
        self._done: set[int] = set()      # modules on_forward took

    @property
    def is_open(self) -> bool:
        return self._open

    def watched(self) -> int:
        """How many modules have a hook of their own now."""
        return len(self._hooks)

    def open(self) -> None:
        """Watch every module call until the next step that ran a module ends (idempotent)."""
        if not self._open:
            self._open, self._ran = True, False
        if self._global is None:
            from torch.nn.modules.module import register_module_forward_pre_hook

            warnings.filterwarnings("ignore", message=_COMPILED_WITH_GLOBAL_HOOKS)
            self._global = register_module_forward_pre_hook(self._discover)

    def step_ended(self, roots: Callable[[], Iterable[torch.nn.Module]] = tuple) -> None:
        """An optimizer step ended.  If the window is open and modules ran in it, close it:
        offer the modules with buffers in their trees and in ``roots()``, hook those not taken
        yet, and drop the global hook (unless a compiled module ran)."""
        if not self._open or not self._ran:
            return
        self._open = False
        memo: set = set()   # named_modules does not descend into a module already in memo
        for root in (*self._new, *roots()):
            for _name, module in root.named_modules(memo=memo):
                self._offer_or_hook(module)
        self._new.clear()
        self._known.clear()  # ids only mean something while _new holds their modules
        if self._global is not None and not self._compiled:
            self._global.remove()
            self._global = None

    def remove(self) -> None:
        """Undo everything (the run ended)."""
        if self._global is not None:
            self._global.remove()
            self._global = None
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()
        self._new.clear()
        self._known.clear()
        self._done.clear()
        self._open = self._ran = self._compiled = False

    def _discover(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        import torch

        if torch.compiler.is_compiling():
            return  # traced into a graph: nothing to learn there, nothing to add to it
        key = id(module)
        if self._open:
            self._ran = True
            if key not in self._known:
                self._known.add(key)
                self._new.append(module)
        if not self._compiled and _is_compiled(module):
            self._compiled = True
        if module._buffers and key not in self._done and self._on_forward(module, args):
            self._taken(key)

    def _offer_or_hook(self, module: torch.nn.Module) -> None:
        key = id(module)
        if not module._buffers or key in self._done or key in self._hooks:
            return
        if self._on_forward(module, None):
            self._taken(key)
        else:
            self._hooks[key] = module.register_forward_pre_hook(self._own)

    def _own(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        import torch

        if not torch.compiler.is_compiling() and self._on_forward(module, args):
            self._taken(id(module))

    def _taken(self, key: int) -> None:
        self._done.add(key)
        handle = self._hooks.pop(key, None)
        if handle is not None:
            handle.remove()  # torch iterates over a copy of the hooks: removing here is safe


def _is_compiled(module: object) -> bool:
    """Whether ``module`` is torch.compile's wrapper (without importing the compiler for it)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(module, eval_frame.OptimizedModule)
