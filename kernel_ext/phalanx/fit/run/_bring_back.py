"""What a finished run gives the notebook: rank 0's ``--return`` values, and a word about the
notebook's objects it trained but did not return.

Example (at the end of a run, in the kernel)::

    bring_back(user_ns, "done", results, prepared.memos)
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from ..._cell_line import say
from ...wire._seam import RankResult


def bring_back(user_ns: dict, status: str, results: Mapping[int, RankResult],
               memos: Mapping[str, Any]) -> None:
    """Bind what rank 0 returned (done, or interrupted: what was trained until the stop), and
    say which notebook objects a finished run trained without ``--return``."""
    rank0 = results.get(0)
    if rank0 is None or status not in ("done", "interrupted"):
        return
    if rank0.returns is not None:
        from ...wire._graph_pickle import loads_returns

        # the notebook's own objects, with their trained state (see _graph_pickle)
        _bind_returns(user_ns, loads_returns(rank0.returns, memos))
    if status == "done" and rank0.trained_not_returned:
        from ...runtime import notice

        say(notice(rank0.trained_not_returned), file=sys.stderr)  # the progress line may be open


def _bind_returns(user_ns: dict, values: dict) -> None:
    """Put what rank 0 returned in the notebook.  A sharded model comes back as its full
    state dict: loaded into the notebook's model of that name (its own object, as for any
    returned model), or, where the notebook has none, bound as the state dict itself."""
    from ...wire._seam import FullStateDict

    for name, value in values.items():
        if not isinstance(value, FullStateDict):
            user_ns[name] = value
        elif callable(getattr(user_ns.get(name), "load_state_dict", None)):
            user_ns[name].load_state_dict(value.state)
        else:
            user_ns[name] = value.state
            say(f"phalanx: --return {name}: the sharded model was built in the cell, so the "
                f"notebook gets its full state dict (load it with model.load_state_dict({name}))",
                file=sys.stderr)
