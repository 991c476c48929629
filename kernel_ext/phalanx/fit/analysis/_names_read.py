"""Which notebook names a cell reads, by Python's scoping rules (pure: stdlib ``ast`` only).

The cell body runs at module level on the engines (``exec`` in a fresh namespace), so a name it
reads comes from the notebook only where the cell has not bound it yet *at that point*: a cell
that opens ``f`` before reading it never needs the notebook's ``f`` (a closed file left by an
earlier cell, which could not be pickled anyway).  :func:`notebook_reads` walks the module-level
statements in order, keeping the names *definitely* bound so far:

* a branch binds for the code after it only what every branch that falls through binds; a loop
  body or an ``except`` handler may not run at all;
* comprehensions, lambdas, functions and class bodies are scopes of their own, as in Python: a
  parameter or a local of a function shadows the notebook name, a class body's names are not
  seen by its methods;
* a function reads its globals when it is *called*, which cannot be known: its free names count
  as notebook reads unless the cell binds them at module level somewhere (``def train(): model()``
  then ``model = Net()``).

Builtins are reported as reads; telling them apart is the caller's job.

Example::

    >>> reads, binds = notebook_reads("with open(p) as f:\\n    data = f.read()\\nprint(total)")
    >>> sorted(reads), sorted(binds)
    (['open', 'p', 'print', 'total'], ['data', 'f'])
"""

from __future__ import annotations

import ast
import functools
from typing import Sequence

from ._walk_state import _Comprehension, _definition_time, _Found, _Scope, visit_generators
from ._deferred_code import _free_names


def notebook_reads(body: str) -> tuple[set[str], set[str]]:
    """(names the cell reads from the notebook namespace, names it binds at module level anywhere).

    A ``SyntaxError`` in ``body`` propagates.  Builtins appear among the reads.
    """
    reads, deferred, binds = split_reads(body)
    return set(reads | deferred), set(binds)


@functools.lru_cache(maxsize=64)
def split_reads(body: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(names read as the cell runs, names only its functions read when called, names it binds
    at module level anywhere): a name missing from the notebook is an error only in the first
    set (a function that names an undefined global fails only if that line runs, as in Python).

    Read three times a run and again at every re-run of the same cell: the answer depends on
    the source alone, so the last cells' answers are kept (frozen: callers share them).  The
    walk was about a third of the kernel's CPU time in a warm re-run of a short cell.
    """
    tree = ast.parse(body)
    found = _Found(lazy_annotations=any(
        isinstance(s, ast.ImportFrom) and s.module == "__future__"
        and any(a.name == "annotations" for a in s.names) for s in tree.body))
    _Now(found, set(), stores_global=True, walrus_global=True).run(tree.body)
    # A function's global is read at some call: if the cell binds it at all, the cell's own
    # binding is the likely one (defined before the call), so the notebook's is not shipped.
    return (frozenset(found.reads), frozenset(found.deferred - found.binds - found.reads),
            frozenset(found.binds))


class _Now(_Scope):
    """Code that runs as the cell runs: the module body, class bodies, comprehensions in them.

    ``bound`` holds the names definitely bound at the point reached; a read of any other name
    reads the notebook.  A class body and a comprehension start from a copy of the module's
    names, so their own names never reach the module.
    """

    def __init__(self, found: _Found, bound: set[str], *, stores_global: bool,
                 walrus_global: bool, class_globals: set[str] | None = None) -> None:
        self.found = found
        self.bound = bound
        self.stores_global = stores_global  # a plain binding here binds a module-level name
        self.walrus_global = walrus_global  # so does ``:=`` (also from inside a comprehension)
        # In a class body: the module's names at its definition.  Methods and comprehensions
        # in a class body skip the class's own names, as in Python.
        self.class_globals = class_globals
        self.ended = False  # the statement just walked never lets the code after it run

    def run(self, body: Sequence[ast.stmt]) -> None:
        for stmt in body:
            self.visit(stmt)
            if self.ended:
                return

    def _read(self, name: str) -> None:
        if name not in self.bound:
            self.found.reads.add(name)

    def _bind(self, name: str) -> None:
        self.bound.add(name)
        if self.stores_global:
            self.found.binds.add(name)

    def _unbind(self, name: str) -> None:
        self.bound.discard(name)

    def _nested_base(self) -> set[str]:
        """The names a class body or comprehension nested here sees as bound when it starts."""
        return set(self.class_globals if self.class_globals is not None else self.bound)

    def _block(self, body: Sequence[ast.stmt], start: set[str],
               head: Sequence[ast.AST] = ()) -> set[str] | None:
        """Walk ``head`` (a loop target, a handler's name...) then ``body`` from ``start``: the
        names bound at the end, or None where the block never reaches its end."""
        saved, self.bound = self.bound, set(start)
        try:
            for node in [*head, *body]:
                self.visit(node)
                if self.ended:
                    self.ended = False
                    return None
            return self.bound
        finally:
            self.bound = saved

    def _join(self, ends: Sequence[set[str] | None]) -> None:
        """After paths that meet: only what every path reaching here binds is definite."""
        live = [end for end in ends if end is not None]
        if live:
            self.bound = set.intersection(*live)
        else:
            self.ended = True

    # -- statements -------------------------------------------------------------------------

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)  # the value is read before any target is bound
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):  # ``x += 1`` reads x, then binds it
            self._read(node.target.id)
            self.visit(node.value)
            self._bind(node.target.id)
        else:
            self.visit(node.target)
            self.visit(node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        if not self.found.lazy_annotations:  # module and class annotations are evaluated
            self.visit(node.annotation)
        # A bare ``x: int`` binds nothing; ``a.b: int`` still evaluates ``a``.
        if node.value is not None or not isinstance(node.target, ast.Name):
            self.visit(node.target)

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self._join([self._block(node.body, self.bound), self._block(node.orelse, self.bound)])

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self._loop(self._block(node.body, self.bound, [node.target]), node.orelse)

    visit_AsyncFor = visit_For

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        self._loop(self._block(node.body, self.bound), node.orelse)

    def _loop(self, body_end: set[str] | None, orelse: Sequence[ast.stmt]) -> None:
        # The body may run zero times and ``else`` may be skipped by ``break``: neither binds
        # anything definite after the loop (but a ``del`` in them may unbind).
        else_end = self._block(orelse, self.bound)
        ends = [end for end in (body_end, else_end) if end is not None]
        self.bound = set.intersection(self.bound, *ends)

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        head: list[ast.AST] = []
        for item in node.items:
            head.append(item.context_expr)
            if item.optional_vars is not None:
                head.append(item.optional_vars)  # ``as f`` binds f for the body and after
        self._join([self._block(node.body, self.bound, head)])

    visit_AsyncWith = visit_With

    def visit_Try(self, node: ast.Try | ast.TryStar) -> None:
        before = set(self.bound)
        body_end = self._block(node.body, before)
        # A handler may start anywhere in the body: from what was bound before it that the
        # body did not unbind.
        start = before if body_end is None else before & body_end
        ends = [None if body_end is None else self._block(node.orelse, body_end)]
        ends += [self._handler(handler, start) for handler in node.handlers]
        self._join(ends)
        if node.finalbody:
            self._finally(node.finalbody, start, ends)

    visit_TryStar = visit_Try

    def _handler(self, handler: ast.ExceptHandler, start: set[str]) -> set[str] | None:
        head: list[ast.AST] = [handler.type] if handler.type is not None else []
        if handler.name is not None:
            head.append(ast.Name(id=handler.name, ctx=ast.Store()))
        end = self._block(handler.body, start, head)
        if end is not None and handler.name is not None:
            end.discard(handler.name)  # Python deletes ``e`` of ``except E as e`` at the end
        return end

    def _finally(self, body: Sequence[ast.stmt], start: set[str],
                 ends: Sequence[set[str] | None]) -> None:
        # ``finally`` runs whichever way the statement is left: read from what every way binds.
        fin_start = set.intersection(start, *(e for e in ends if e is not None))
        fin_end = self._block(body, fin_start)
        if fin_end is None:
            self.ended = True
        elif not self.ended:
            self.bound = (self.bound - (fin_start - fin_end)) | fin_end

    def visit_Match(self, node: ast.Match) -> None:
        self.visit(node.subject)
        ends = [self._block(case.body, self.bound,
                            [case.pattern] + ([case.guard] if case.guard is not None else []))
                for case in node.cases]
        last = node.cases[-1] if node.cases else None
        wildcard = (last is not None and last.guard is None
                    and isinstance(last.pattern, ast.MatchAs) and last.pattern.pattern is None)
        if not wildcard:  # no case may match: the code after starts from the subject
            ends.append(set(self.bound))
        self._join(ends)

    def visit_Raise(self, node: ast.Raise) -> None:
        self.generic_visit(node)
        self.ended = True

    def visit_Return(self, node: ast.Return) -> None:
        self.generic_visit(node)
        self.ended = True

    def visit_Break(self, node: ast.Break) -> None:
        self.ended = True

    def visit_Continue(self, node: ast.Continue) -> None:
        self.ended = True

    # -- definitions and expressions --------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for part in [*node.decorator_list,
                     *_definition_time(node.args, node.returns, self.found.lazy_annotations)]:
            self.visit(part)
        self.found.deferred |= _free_names(node, self.found)
        self._bind(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for part in _definition_time(node.args, None, self.found.lazy_annotations):
            self.visit(part)
        self.found.deferred |= _free_names(node, self.found)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for part in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(part)
        base = self._nested_base()
        _Now(self.found, set(base), stores_global=False, walrus_global=False,
             class_globals=base).run(node.body)
        self._bind(node.name)  # bound once the body has run

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.bound.add(node.target.id)
        if self.walrus_global:
            self.found.binds.add(node.target.id)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        # Only the first operand surely runs: a ``:=`` in a later one is not definite after.
        self.visit(node.values[0])
        after_first = set(self.bound)
        for value in node.values[1:]:
            self.visit(value)
        self.bound = after_first

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        before = set(self.bound)
        self.visit(node.body)
        self.bound, body_end = before, self.bound
        self.visit(node.orelse)
        self.bound &= body_end

    def _comprehension(self, node: _Comprehension, parts: Sequence[ast.expr]) -> None:
        # The first iterable is evaluated here; the rest runs in the comprehension's own scope,
        # where its targets are local and other names are read from here (at this point).
        generators = node.generators
        self.visit(generators[0].iter)
        inner = _Now(self.found, self._nested_base(), stores_global=False,
                     walrus_global=self.walrus_global)
        visit_generators(inner, generators, parts)
