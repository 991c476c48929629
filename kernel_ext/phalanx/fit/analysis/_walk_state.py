"""The shared parts of the scope walks of :mod:`phalanx.fit.analysis._names_read`: what the walk learns (:class:`_Found`),
how a name is read, bound and unbound (:class:`_Scope`), and the comprehension walk both use."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Sequence

_Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_Comprehension = ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp


@dataclass
class _Found:
    """What the walk has learnt about the whole cell."""

    lazy_annotations: bool  # ``from __future__ import annotations``: annotations are never read
    reads: set[str] = field(default_factory=set)     # read while not definitely bound
    binds: set[str] = field(default_factory=set)     # bound at module level, anywhere
    deferred: set[str] = field(default_factory=set)  # global reads of function bodies


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The names an import binds: ``import a.b.c`` binds ``a``; ``from m import *``, none known."""
    if isinstance(node, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    return [a.asname or a.name for a in node.names if a.name != "*"]


def _every_arg(args: ast.arguments) -> list[ast.arg]:
    return [*args.posonlyargs, *args.args, *args.kwonlyargs,
            *(a for a in (args.vararg, args.kwarg) if a is not None)]


def _definition_time(args: ast.arguments, returns: ast.expr | None, lazy: bool) -> list[ast.expr]:
    """The parts of a ``def``/``lambda`` evaluated where it is defined: defaults, annotations."""
    evaluated: list[ast.expr] = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    if not lazy:
        evaluated += [a.annotation for a in _every_arg(args) if a.annotation is not None]
        evaluated += [returns] if returns is not None else []
    return evaluated


class _Scope(ast.NodeVisitor):
    """What the two walks share: how names are read, bound and unbound."""

    def _read(self, name: str) -> None:
        raise NotImplementedError

    def _bind(self, name: str) -> None:
        raise NotImplementedError

    def _unbind(self, name: str) -> None:
        raise NotImplementedError

    def _comprehension(self, node: _Comprehension, parts: Sequence[ast.expr]) -> None:
        raise NotImplementedError

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._read(node.id)
        elif isinstance(node.ctx, ast.Del):
            self._unbind(node.id)
        else:
            self._bind(node.id)

    def visit_Import(self, node: ast.Import) -> None:
        for name in _imported(node):
            self._bind(name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for name in _imported(node):
            self._bind(name)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.pattern is not None:
            self.visit(node.pattern)
        if node.name is not None:
            self._bind(node.name)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name is not None:
            self._bind(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self.generic_visit(node)  # keys are values read, patterns may capture
        if node.rest is not None:
            self._bind(node.rest)

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node, [node.elt])

    def visit_SetComp(self, node: ast.SetComp) -> None:
        self._comprehension(node, [node.elt])

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> None:
        self._comprehension(node, [node.elt])

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node, [node.key, node.value])


def visit_generators(inner: ast.NodeVisitor, generators: Sequence[ast.comprehension],
                     parts: Sequence[ast.expr]) -> None:
    """A comprehension's own scope, walked by ``inner``: each generator's iterable but the
    first (that one is evaluated outside), its target and conditions, then the parts."""
    for i, generator in enumerate(generators):
        if i:
            inner.visit(generator.iter)
        inner.visit(generator.target)
        for condition in generator.ifs:
            inner.visit(condition)
    for part in parts:
        inner.visit(part)
