"""``--shuffle-modules SEED``: run the test modules in a shuffled order, to find tests that pass
only because of what an earlier module left behind (a name in the shared notebook, a cluster
state, an environment variable).

The seed is printed in the header; ``random`` draws one.  The same seed gives the same order, so
a failure found this way is replayed with ``--shuffle-modules SEED``.  The tests of a module keep
their order and stay together.  Under xdist the draw is made once, by the first pytest process,
and handed to the workers through the environment (each worker must collect the same order);
add ``--no-loadscope-reorder`` so that xdist hands modules out in that order rather than by size
(``make test-shuffled`` does both).

Example::

    pytest --shuffle-modules random -n 2 --dist loadfile --no-loadscope-reorder
"""

from __future__ import annotations

import os
import random

import pytest

_SEED_VARIABLE = "PHALANX_TEST_MODULE_SEED"


def pytest_addoption(parser):
    parser.addoption("--shuffle-modules", metavar="SEED", default=None,
                     help="run test modules in an order shuffled by SEED (an integer, or 'random')")


def _seed(config) -> int | None:
    asked = config.getoption("--shuffle-modules")
    if asked is None:
        return None
    if _SEED_VARIABLE not in os.environ:  # the first pytest process decides; workers inherit it
        try:
            drawn = random.SystemRandom().randrange(10**6) if asked == "random" else int(asked)
        except ValueError:
            raise pytest.UsageError(f"--shuffle-modules takes an integer or 'random', got {asked!r}") \
                from None
        os.environ[_SEED_VARIABLE] = str(drawn)
    return int(os.environ[_SEED_VARIABLE])


def pytest_configure(config):
    config._phalanx_module_seed = _seed(config)


def pytest_report_header(config):
    seed = config._phalanx_module_seed
    if seed is not None:
        return f"test modules shuffled: --shuffle-modules {seed} replays this order"
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    seed = config._phalanx_module_seed
    if seed is None:
        return
    modules = sorted({item.nodeid.split("::")[0] for item in items})
    random.Random(seed).shuffle(modules)
    position = {module: index for index, module in enumerate(modules)}
    items.sort(key=lambda item: position[item.nodeid.split("::")[0]])  # stable within a module
