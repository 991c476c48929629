"""Checks a JSON message against a declarative shape: a table of field -> what it must hold.

A *spec* says what one field holds; it is one of

* a kind name: ``"int"``, ``"number"``, ``"string"``, ``"bool"``, ``"list"`` or ``"object"``; a
  trailing ``"?"`` lets the field also be absent or null;
* a *shape*, a dict of field name -> spec: an object with those fields (others pass unchecked);
* a :class:`Field`, for what a kind name cannot say: what a list's entries or an object's values
  are, a list of choices, a range, a sibling a number may not be below, one more check.

Errors name the message, the path of the field and what was expected.  The lab extension's
``schema.ts`` is the same interpreter in TypeScript; keep the two in step.

Example::

    >>> check({"n": Field("int", least=1)}, {"n": 0}, "scale")
    Traceback (most recent call last):
    ...
    phalanx._schema.SchemaError: scale: n must be at least 1, got 0
    >>> check({"rows": Field("list", items={"step": "int"})}, {"rows": [{"step": 1.5}]}, "metrics")
    Traceback (most recent call last):
    ...
    phalanx._schema.SchemaError: metrics: field 'rows[0].step' must be int, got number
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeAlias, Union


class SchemaError(ValueError):
    """A message that does not fit the schema."""


@dataclass(frozen=True)
class Field:
    """What one field holds, beyond its kind.

    ``kind`` is a kind name, or ``"pair"``: a list of exactly two ``items``.  ``items`` is what
    each entry of a list or pair is, or each value of an object; ``fields`` the shape of an
    object.  ``choices``: the strings allowed.  ``least``/``most``: the range of a number.
    ``not_before``: a sibling number field this one may not be below.  ``then``: one more check
    of the value, raising :class:`SchemaError`.
    """

    kind: str
    optional: bool = False
    items: Spec | None = None
    fields: Shape | None = None
    choices: tuple[str, ...] = ()
    least: int | None = None
    most: int | None = None
    not_before: str | None = None
    then: Callable[[Any], object] | None = None


Spec: TypeAlias = Union[str, Field, Mapping[str, "Spec"]]
Shape: TypeAlias = Mapping[str, Spec]


def check(shape: Shape, msg: Mapping[str, Any], where: str, path: str = "") -> None:
    """Check that ``msg`` holds every field of ``shape``; raise :class:`SchemaError` if not."""
    for key, spec in shape.items():
        field, name = _as_field(spec), path + key
        if msg.get(key) is None and field.optional:
            continue
        if key not in msg:
            raise SchemaError(f"{where}: missing field '{name}'")
        _check_value(field, msg[key], where, name, msg)


def _as_field(spec: Spec) -> Field:
    if isinstance(spec, Field):
        return spec
    if isinstance(spec, str):
        field = _STRING_FIELDS.get(spec)
        if field is None:  # a few dozen spellings: made once, not at every field of every event
            field = _STRING_FIELDS[spec] = Field(spec.rstrip("?"), optional=spec.endswith("?"))
        return field
    return Field("object", fields=spec)


_STRING_FIELDS: dict[str, Field] = {}


def _check_value(field: Field, value: Any, where: str, name: str,
                 parent: Mapping[str, Any] | None = None) -> None:
    if not _fits(value, field.kind):
        raise SchemaError(f"{where}: field '{name}' must be {_expected(field)}, got {kind_of(value)}")
    if field.choices and value not in field.choices:
        raise SchemaError(f"{where}: {name} '{value}' not one of {', '.join(field.choices)}")
    _check_range(field, value, where, name)
    sibling = field.not_before
    if sibling is not None and parent is not None and value < parent[sibling]:
        raise SchemaError(f"{where}: {name} ({value}) is before {sibling} ({parent[sibling]}); "
                          f"give {sibling} <= {name}")
    if field.fields is not None:
        check(field.fields, value, where, name + ".")
    if field.items is not None:
        item = _as_field(field.items)
        named = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, entry in named:
            entry_name = f"{name}.{key}" if isinstance(value, Mapping) else f"{name}[{key}]"
            if not (entry is None and item.optional):
                _check_value(item, entry, where, entry_name)
    if field.then is not None:
        try:
            field.then(value)
        except SchemaError as exc:
            raise SchemaError(f"{where}: {name}: {exc}") from None


def _check_range(field: Field, value: Any, where: str, name: str) -> None:
    least, most = field.least, field.most
    if least is not None and most is not None and not least <= value <= most:
        raise SchemaError(f"{where}: {name} must be between {least} and {most}, got {value}")
    if least is not None and value < least:
        raise SchemaError(f"{where}: {name} must be at least {least}, got {value}")
    if most is not None and value > most:
        raise SchemaError(f"{where}: {name} must be at most {most}, got {value}")


def _fits(value: Any, kind: str) -> bool:
    if kind in ("int", "number") and isinstance(value, bool):
        return False
    if kind == "pair":
        return isinstance(value, list) and len(value) == 2
    return isinstance(value, _KINDS[kind])


_KINDS: dict[str, type | tuple[type, ...]] = {
    "int": int, "number": (int, float), "string": str, "bool": bool, "list": list,
    "object": Mapping,
}


def _expected(field: Field) -> str:
    if field.kind != "pair":
        return field.kind
    item = _as_field(field.items).kind if field.items is not None else "any"
    return f"a [{item}, {item}] pair"


def kind_of(value: Any) -> str:
    """The JSON name of a value's kind, as the messages say it."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"list of {len(value)}"
    for kind in ("bool", "int", "number", "string", "object"):
        if _fits(value, kind):
            return kind
    return type(value).__name__
