"""The suite's own promise: a test module sees nothing another module typed into the shared
notebook, whichever modules a worker runs and in what order.

Two small modules run in one pytest process (one worker, as xdist's loadfile may put them),
the first leaving a name behind, the second asking for a suggestion that the name would spoil;
both orders, and the shuffle option's seed printed and replayed.
"""

from __future__ import annotations

import re
from pathlib import Path

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

LEAVES_A_NAME = '''
def test_leaves_order_behind(shell):
    shell.run_cell("order = [3, 1, 2]\\nmodel = 'a model'\\n")
    assert "order" in shell.user_ns
'''

SUGGESTS = '''
from notebook_shell import clean_notebook

def test_a_typo_is_told_the_one_close_name(shell, capsys):
    assert "order" not in shell.user_ns  # the other module's name is gone
    clean_notebook()
    shell.run_cell("model = object()\\n")
    capsys.readouterr()
    shell.run_cell("%%distributed_fit\\nprint(modle)\\n")
    text = capsys.readouterr()
    said = text.out + text.err
    assert "did you mean 'model'?" in said, said
'''


def _two_modules(pytester) -> None:
    pytester.syspathinsert(TESTS)
    pytester.makeconftest('pytest_plugins = ["notebook_shell", "module_order"]\n')
    pytester.makepyfile(test_a_leaves=LEAVES_A_NAME, test_b_suggests=SUGGESTS)


def test_a_name_left_by_one_module_is_not_seen_by_the_next(pytester):
    _two_modules(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)


def test_a_shuffled_order_is_printed_and_replayed(pytester):
    _two_modules(pytester)
    first = pytester.runpytest_subprocess("--shuffle-modules", "random", "-v")
    first.assert_outcomes(passed=2)
    seed = re.search(r"--shuffle-modules (\d+) replays", first.stdout.str()).group(1)
    order = [line.split("::")[0] for line in first.stdout.lines if "PASSED" in line]
    again = pytester.runpytest_subprocess("--shuffle-modules", seed, "-v")
    assert [line.split("::")[0] for line in again.stdout.lines if "PASSED" in line] == order
