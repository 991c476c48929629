"""Code that runs later, when a function defined in the cell is called: its locals follow
Python's rule for the whole body, and its free names are what it may read from the notebook."""

from __future__ import annotations

import ast
from typing import Sequence

from ._walk_state import (_Comprehension, _definition_time, _every_arg, _Found, _Function, _Scope,
                          visit_generators)


class _Later(_Scope):
    """A function body (or a class body inside one): what it binds and reads, in any order.

    Python decides a function's locals from the whole body: a name bound anywhere in it is
    local everywhere in it, unless declared ``global`` or ``nonlocal``.
    """

    def __init__(self, found: _Found, function: _Later | None = None, *,
                 class_body: bool = False) -> None:
        self.found = found
        self.function = function or self  # where ``:=`` binds (a comprehension's function)
        self.class_body = class_body
        self.binds: set[str] = set()
        self.loads: set[str] = set()
        self.declared_global: set[str] = set()
        self.nonlocals: set[str] = set()
        self.inner_free: set[str] = set()  # nested scopes' free names: resolved here or further out

    def _read(self, name: str) -> None:
        self.loads.add(name)

    def _bind(self, name: str) -> None:
        self.binds.add(name)

    def _unbind(self, name: str) -> None:
        self.binds.add(name)  # ``del x`` makes x local, like a binding

    def free(self) -> set[str]:
        """The names this scope reads from enclosing scopes (``global`` ones go to the module)."""
        local = self.binds - self.declared_global - self.nonlocals
        if self.class_body:  # a class's names are not seen by the scopes nested in it
            free = (self.loads - local) | self.inner_free
        else:
            free = (self.loads | self.inner_free) - local
        declared = free & self.declared_global
        self.found.deferred |= declared
        self.found.binds |= self.binds & self.declared_global  # ``global x; x = ...``
        return free - declared

    def visit_Global(self, node: ast.Global) -> None:
        self.declared_global.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.nonlocals.update(node.names)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for part in [*node.decorator_list,
                     *_definition_time(node.args, node.returns, self.found.lazy_annotations)]:
            self.visit(part)
        self._bind(node.name)
        self.inner_free |= _free_names(node, self.found)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for part in _definition_time(node.args, None, self.found.lazy_annotations):
            self.visit(part)
        self.inner_free |= _free_names(node, self.found)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for part in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(part)
        self._bind(node.name)
        body = _Later(self.found, class_body=True)
        for stmt in node.body:
            body.visit(stmt)
        self.inner_free |= body.free()

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name is not None:
            self._bind(node.name)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        # Even a bare ``x: int`` makes x local to a function; in a class body it binds nothing.
        if node.value is not None or not (self.class_body and isinstance(node.target, ast.Name)):
            self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)
        if self.class_body and not self.found.lazy_annotations:  # a function's are never read
            self.visit(node.annotation)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.function._bind(node.target.id)

    def _comprehension(self, node: _Comprehension, parts: Sequence[ast.expr]) -> None:
        self.visit(node.generators[0].iter)  # evaluated in this scope
        inner = _Later(self.found, self.function)
        visit_generators(inner, node.generators, parts)
        self.inner_free |= inner.free()


def _free_names(node: _Function, found: _Found) -> set[str]:
    """The names a function's body reads from outside itself when it runs (its free names)."""
    scope = _Later(found)
    scope.binds |= {a.arg for a in _every_arg(node.args)}
    for stmt in node.body if isinstance(node.body, list) else [node.body]:
        scope.visit(stmt)
    return scope.free()
