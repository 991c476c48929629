"""Stream what the ranks print into the cell as it arrives, one ``[rank r]`` prefix per line."""

from __future__ import annotations

import sys
from typing import Any


class OutputStreamer:
    """Print new complete lines of each rank's stdout/stderr (ipyparallel collects them)."""

    def __init__(self, ars: list[Any]) -> None:
        self._ars = ars
        self._seen = {(r, s): 0 for r in range(len(ars)) for s in ("stdout", "stderr")}

    def flush(self, final: bool = False) -> None:
        for rank, ar in enumerate(self._ars):
            for stream, sink in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                text = _text(getattr(ar, stream, ""))
                start = self._seen[(rank, stream)]
                end = len(text) if final else text.rfind("\n", start) + 1
                if end > start:
                    chunk = text[start:end]
                    self._seen[(rank, stream)] = end
                    sink.write("".join(f"[rank {rank}] {line}\n" for line in chunk.splitlines()))


def _text(value: Any) -> str:
    if isinstance(value, list):  # a multi-engine result; ours are single-engine
        return value[0] if value else ""
    return value or ""
