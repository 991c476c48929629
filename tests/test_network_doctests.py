"""The examples in the network modules' docstrings run and say what they show."""

import doctest
import importlib
import pkgutil

import phalanx.network
import pytest

MODULES = ["phalanx.network"] + [f"phalanx.network.{m.name}"
                                 for m in pkgutil.iter_modules(phalanx.network.__path__)]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
