"""The names a run needs, checked against the notebook before the cluster is asked (pure).

:func:`~phalanx.fit.run._dispatch.prepare` checks them again as it packs, but only once engines are chosen:
without this check a person who has no cluster yet hears about that first and about the typo
in ``--shard`` one try later, and a ``--return`` name the cell never defines fails on rank 0
only once the whole training is over.

Example::

    >>> from phalanx.fit import FitOptions
    >>> try:
    ...     check_cell("print(modle)", FitOptions(), {"model": 1})
    ... except NameError as exc:
    ...     print(exc)
    the cell uses 'modle', which is not defined in the notebook; did you mean 'model'? Otherwise define it in an earlier cell or inside this one
"""

from __future__ import annotations

import ast
import functools
from typing import Any, Iterable, Mapping

from ..run._dispatch import INJECTED
from ..run._fit_options import FitOptions, FitUsageError
from ._names_read import split_reads
from ._shipping import UndefinedNameError, check_defined, notebook_names, resolve_names
from ..run._strategy import notebook_strategy
from ._suggest import did_you_mean, joined

# A cell that runs code from a string or writes its globals by name may define any name.
_DYNAMIC = frozenset({"exec", "eval", "globals", "vars", "__import__"})


def check_cell(body: str, opts: FitOptions, user_ns: Mapping[str, Any],
               kept: Iterable[str] = ()) -> None:
    """Refuse, naming it and the close names that exist, a ``--shard`` name, a ``--sync``
    class, a name the cell reads or a ``--return`` name that is defined nowhere; and a cell
    that is not Python, naming the line."""
    check_defined("--shard", opts.train.shard, user_ns)
    notebook_strategy(opts.train.sync, user_ns)
    try:
        ast.parse(body)
    except SyntaxError as exc:  # said as one line: the frames shown would be phalanx's, not the cell's
        text = (exc.text or "").strip()
        line = (exc.lineno or 0) + 1  # as the notebook numbers it: the magic's line is line 1
        raise FitUsageError(f"the cell is not valid Python (line {line}: {exc.msg})"
                            + (f": {text}" if text else "")) from None
    injected = set(INJECTED) | set(opts.train.shard) | set(kept)  # kept: live on the engines
    resolve_names(body, user_ns, injected=injected)
    check_returns(body, opts.train.returns, user_ns, injected)
    check_returns(body, opts.train.keep, user_ns, injected, flag="--keep")


def check_returns(body: str, returns: Iterable[str], user_ns: Mapping[str, Any],
                  injected: Iterable[str] = (), flag: str = "--return") -> None:
    """Each ``--return`` (or ``--keep``: ``flag``) name is one the cell binds, a notebook name
    or an ``injected`` one (``rank``, the shards, kept names): there is nothing else to bring
    back or keep.

    A notebook name the cell does not read may still reach the engines (a shipped function's
    global: ``fit()`` training the notebook's ``model``), so only a name defined nowhere is
    refused: the typo.
    """
    returns = list(returns)
    if not returns:
        return
    reads, deferred, binds = split_reads(body)
    if _DYNAMIC & (reads | deferred) or _star_import(body):
        return  # such a cell may bind anything: the engine's own check stays the judge
    for name in returns:
        if name not in binds and name not in user_ns and name not in injected:
            meant = did_you_mean(name, [*binds, *notebook_names(user_ns), *injected])
            what = "rank 0 would have nothing to bring back" if flag == "--return" else \
                "the engines would have nothing to keep"
            raise UndefinedNameError(joined(
                f"{flag} {name!r}: the cell does not assign it and the notebook does not "
                f"define it, so {what}", meant))


@functools.lru_cache(maxsize=64)
def _star_import(body: str) -> bool:
    return any(isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
               for node in ast.walk(ast.parse(body)))
