"""A magic's line, parsed; a flag it does not have is named with the closest one it has.

Mistakes in what a person typed reach the cell as IPython's ``UsageError``, which IPython shows
as one line without a traceback (only that exact type: a subclass gets the full traceback).
argparse says ``unrecognized arguments: --shrad``; this says which magic, which flag is meant
and where the list is.

Example::

    >>> from argparse import ArgumentParser
    >>> parser = ArgumentParser()
    >>> _ = parser.add_argument("--shard")
    >>> explain("unrecognized arguments: --shrad=X,y", parser, "%%distributed_fit")
    '%%distributed_fit has no flag --shrad; did you mean --shard? (%%distributed_fit? lists every flag)'
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Iterable

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from .fit.analysis._suggest import did_you_mean, joined

_UNRECOGNIZED = "unrecognized arguments: "


def parse_line(magic: Callable, line: str, shown: str) -> Any:
    """``parse_argstring(magic, line)``; an unknown flag or a stray word raises a one-line
    ``UsageError`` naming it and the closest real flag (``shown``: ``%cluster``...)."""
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        raise UsageError(explain(str(exc), magic.parser, shown)) from None  # type: ignore[attr-defined]


def explain(message: str, parser: argparse.ArgumentParser, shown: str) -> str:
    """argparse's ``message`` about ``parser``'s line, said for a person who typed ``shown``."""
    if not message.startswith(_UNRECOGNIZED):
        return message  # argparse already names the flag and the value ("invalid int value")
    flags = [flag for action in parser._actions for flag in action.option_strings]
    tokens = message[len(_UNRECOGNIZED):].split()
    unknown = [t.split("=", 1)[0] for t in tokens if t.startswith("-")]
    if unknown:  # the words after an unknown flag are most likely its value: not said again
        said = [joined(f"{shown} has no flag {flag}", did_you_mean(flag, flags, show=str, n=1))
                for flag in unknown]
        return "; ".join(said) + f" ({shown}? lists every flag)"
    # Words no argument takes: most often a list written with spaces, `--shard X, y`.
    return (f"{shown} does not take {', '.join(map(repr, tokens))}: a flag takes one value, "
            f"with no spaces in a list (X,y); {shown}? lists every flag")


def unknown_word(kind: str, word: str, valid: Iterable[str]) -> str:
    """``unknown %cluster action 'strat'; valid: start, ...; did you mean 'start'?``"""
    valid = list(valid)
    return joined(f"unknown {kind} {word!r}; valid: {', '.join(valid)}", did_you_mean(word, valid))
