"""jupyter_bokeh's ``BokehModel``, sending a burst of streamed points as one message.

``BokehModel`` turns each bokeh document event into its own PATCH-DOC message, and building one
costs a walk over every model of the document.  A live plot appends to several lines per update
(one per rank, the mean, per metric), so :meth:`BatchedBokehModel.batched` holds the streaming
events of one update and sends them together: one walk, one message.

It also marks the document synced after each full render, so a patch carries only what changed
(jupyter_bokeh leaves every model "new", and its first patch re-sends the whole document).

Only ``ColumnsStreamed`` and ``ColumnsPatched`` events are held.  Their payload is the new points
(or the patched values) alone, so sending them late, in order, is exact.  Any other event (a new line or tab) flushes what is held and goes out at once,
serialized while its data is still what it was: held back, a new source would be serialized
with the points streamed after it, and the browser would get those points twice.

Example::

    model = BatchedBokehModel(layout)
    with model.batched():
        source_a.stream({"x": [1], "y": [2.0]})
        source_b.stream({"x": [1], "y": [3.0]})   # both leave in one PATCH-DOC message
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator

from bokeh.document.events import ColumnsPatchedEvent, ColumnsStreamedEvent
from bokeh.protocol import Protocol
from jupyter_bokeh import BokehModel


class BatchedBokehModel(BokehModel):
    """A ``BokehModel`` whose streaming updates can be batched (same frontend model)."""

    def __init__(self, model: Any, **kwargs: Any) -> None:
        self._held: list | None = None
        self._hold_all = False
        self.patched = False  # whether the document changed since it was last rendered whole
        self._closed = False
        super().__init__(model, **kwargs)

    def close(self) -> None:
        """Close once: jupyter_bokeh's close removes its document callback each time it is
        called (again from ``__del__``), and the second removal raises ``KeyError``."""
        if self._closed:
            return
        self._closed = True
        super().close()

    def update_from_model(self, model: Any) -> None:
        """Render ``model`` anew (the whole document goes in ``render_bundle``)."""
        super().update_from_model(model)
        # Every model now present was just sent whole: mark them synced, or the next patch
        # would serialize the entire document again (jupyter_bokeh leaves them "new").
        self._document.models.flush_synced()
        self.patched = False

    @contextmanager
    def batched(self, everything: bool = False) -> Iterator[None]:
        """Hold streamed points until the block ends, then send them as one message.

        ``everything=True`` holds every event: only for blocks that build or relabel models and
        stream nothing into the sources they create (see the module notes).
        """
        if self._held is not None:  # nested: the outer block sends
            yield
            return
        self._held, self._hold_all = [], everything
        try:
            yield
        finally:
            held, self._held, self._hold_all = self._held, None, False
            if held:
                self._send_patch(held)

    def _document_patched(self, event: Any) -> None:  # called by bokeh for every document event
        if event.setter is self:
            return
        self.patched = True
        if self._held is not None:
            if self._hold_all or isinstance(event, (ColumnsStreamedEvent, ColumnsPatchedEvent)):
                self._held.append(event)
                return
            held, self._held = self._held, []
            if held:
                self._send_patch(held)
        self._send_patch([event])

    def _send_patch(self, events: list) -> None:
        # The framing jupyter_bokeh's frontend expects (see BokehModel._document_patched).
        msg = Protocol().create("PATCH-DOC", events)
        self.send({"msg": "patch", "payload": msg.header_json})
        self.send({"msg": "patch", "payload": msg.metadata_json})
        self.send({"msg": "patch", "payload": msg.content_json})
        for buffer in msg.buffers:
            self.send({"msg": "patch", "payload": json.dumps(buffer.ref)})
            self.send({"msg": "patch"}, [buffer.to_bytes()])
