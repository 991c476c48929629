"""Unpickling in the notebook's kernel that never rewrites a class the kernel already has.

cloudpickle sends a class defined in the notebook by value, with a tracking id.  When a class
with that id comes back (a returned model whose class the notebook shipped), cloudpickle finds
the kernel's own class by the id and then *sets every attribute of the pickled copy on it*: the
notebook's ``__init__``, ``forward`` and the rest are replaced by copies rebuilt from the
engine.  Those copies lose what binds them to their class (their ``__class__`` cell comes back
empty), so every ``super()`` in the notebook's methods fails from then on, and a person who
redefined nothing finds ``MyModel()`` broken by a run that only returned a model.

Here a class the kernel already tracks comes back as itself, untouched: an instance of it gets
its new state, its class keeps the notebook's definition.  A class the kernel has never seen
(defined inside the cell on the engines) is built as cloudpickle builds it.

Example::

    >>> import cloudpickle
    >>> class Point:
    ...     def norm(self):
    ...         return 1.0
    >>> blob = cloudpickle.dumps(Point())
    >>> type(loads_with_same_classes(blob)) is Point
    True
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

import cloudpickle.cloudpickle as _cloudpickle

# The cloudpickle helpers a stream names by module and attribute, and what builds them here
_CLOUDPICKLE_MODULES = ("cloudpickle.cloudpickle", "cloudpickle.cloudpickle_fast", "cloudpickle")
_SKELETONS = ("_make_skeleton_class", "_make_skeleton_enum")
_SETSTATE = "_class_setstate"


class ClassKeepingUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` for cloudpickle streams that keeps the classes the process
    already tracks as they are (see the module's docstring)."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file)
        self._kept: set[int] = set()  # ids of existing classes the stream found by tracking id

    def find_class(self, module: str, name: str) -> Any:
        if module in _CLOUDPICKLE_MODULES:
            if name in _SKELETONS:
                return self._skeleton(getattr(_cloudpickle, name))
            if name == _SETSTATE:
                return self._class_setstate
        return super().find_class(module, name)

    def _skeleton(self, make: Any) -> Any:
        def make_or_find(*args: Any) -> Any:
            tracking_id = args[4] if make.__name__ == "_make_skeleton_class" else args[5]
            known = _cloudpickle._DYNAMIC_CLASS_TRACKER_BY_ID.get(tracking_id) \
                if tracking_id is not None else None
            made = make(*args)
            if known is not None and made is known:
                self._kept.add(id(made))
            return made
        return make_or_find

    def _class_setstate(self, cls: Any, state: Any) -> Any:
        if id(cls) in self._kept:
            return cls  # the process's own class: its definition stays the one it has
        return _cloudpickle._class_setstate(cls, state)


def loads_with_same_classes(blob: bytes) -> Any:
    """``cloudpickle.loads(blob)``, except that classes this process already has stay as they
    are."""
    return ClassKeepingUnpickler(io.BytesIO(blob)).load()
