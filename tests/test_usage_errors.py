"""A typo in a magic's line or in the cell is one line in the cell, naming what is wrong and
what was likely meant: no traceback through phalanx's modules.

The cells run in a real IPython shell and the tests read what it printed, as a person would.
The names are checked before any engine is asked, so most tests need no cluster; one runs the
reported case with a cluster up.
"""

from __future__ import annotations

import pytest
from conftest import run_cell
from IPython.core.error import UsageError
from notebook_shell import clean_notebook

INTERNALS = ("Traceback", "_magics.py", "_session.py", "_dispatch.py", "_shipping.py", "_run.py")


@pytest.fixture
def names(shell):
    """A notebook that holds exactly these names: the suggestions are drawn from it."""
    clean_notebook()
    run_cell(shell, "Xtr = [[0.0]] * 8\nytr = [0] * 8\nmodel = object()\n")
    yield shell
    for name in ("Xtr", "ytr", "model"):
        shell.user_ns.pop(name, None)


def shown(shell, capsys, source: str) -> str:
    """What the cell printed; the cell must have failed with a one-line UsageError."""
    capsys.readouterr()
    result = shell.run_cell(source, store_history=False)
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert type(result.error_in_exec) is UsageError, (result.error_in_exec, text)
    assert text.startswith("UsageError: "), text
    assert "\n" not in text, text
    assert not [part for part in INTERNALS if part in text], text
    return text


@pytest.mark.parametrize("source, parts", [
    ("%%distributed_fit --shard Xtr,ytrr\npass\n",
     ("--shard names 'ytrr', not defined in the notebook", "did you mean 'ytr'?")),
    ("%%distributed_fit --shrad Xtr,ytr\npass\n",
     ("%%distributed_fit has no flag --shrad", "did you mean --shard?")),
    ("%%distributed_fit --shard=Xtr,ytr --retrun=model\nprint(model)\n",
     ("no flag --retrun", "did you mean --return?")),
    ("%%distributed_fit --shard Xtr, ytr\npass\n", ("does not take 'ytr'", "--shard X,y")),
    ("%%distributed_fit --shard Xtr,ytr\nprint(len(Xtr), modle)\n",
     ("the cell uses 'modle', which is not defined in the notebook", "did you mean 'model'?")),
    ("%%distributed_fit --shard Xtr,ytr\nprnit(len(Xtr))\n", ("'prnit'", "did you mean 'print'?")),
    ("%%distributed_fit --return modle\nprint(model)\n",
     ("--return 'modle'", "nothing to bring back", "did you mean 'model'?")),
    ("%%distributed_fit --sync alreduce\npass\n",
     ("unknown --sync 'alreduce'", "did you mean 'allreduce'?")),
    ("%%distributed_fit --backend glo\npass\n", ("unknown --backend 'glo'", "did you mean 'gloo'?")),
    ("%%distributed_fit --uneven joni\npass\n", ("unknown --uneven 'joni'", "did you mean 'join'?")),
    ("%%distributed_fit --every x\npass\n", ("--every", "invalid int value: 'x'")),
    ("%%distributed_fit --every 0\npass\n", ("--every must be a whole number of at least 1",)),
    ("%%distributed_fit\nx = 1\nfor i in range(3)\n    print(i)\n",
     ("not valid Python (line 3: expected ':')", "for i in range(3)")),
    ("%distributed_fit modle", ("'modle' is not a learning-network node", "did you mean 'model'?")),
])
def test_a_typo_in_a_fit_is_one_line_naming_what_was_meant(names, capsys, source, parts):
    text = shown(names, capsys, source)
    for part in parts:
        assert part in text, text


@pytest.mark.parametrize("line, parts", [
    ("%cluster strat", ("unknown %cluster action 'strat'", "did you mean 'start'")),
    ("%cluster start 4", ("%cluster start takes no '4'", "%cluster start -n 4")),
    ("%cluster start --lancher local", ("%cluster has no flag --lancher", "did you mean --launcher?")),
    ("%cluster start -n two", ("argument -n: invalid int value: 'two'",)),
    ("%cluster scale x", ("%cluster scale N: expected a whole number, got 'x'",)),
])
def test_a_typo_in_cluster_is_one_line(no_cluster, shell, capsys, line, parts):
    text = shown(shell, capsys, line)
    for part in parts:
        assert part in text, text
    assert not no_cluster.running  # a typo starts nothing


def test_no_cluster_is_said_once_in_one_line_also_for_a_background_run(no_cluster, names, capsys):
    for flags in ("", "--background"):
        text = shown(names, capsys, f"%%distributed_fit {flags}\nprint(model)\n")
        assert text == "UsageError: no cluster is running: start one with %cluster start -n 2"


def test_a_typo_is_said_before_there_is_a_cluster(no_cluster, names, capsys):
    """The name is checked first: fixing the cluster would only lead to the typo next."""
    text = shown(names, capsys, "%%distributed_fit --shard Xtr,ytrr --background\npass\n")
    assert "did you mean 'ytr'?" in text


def test_python_callers_still_get_a_name_error(names):
    from phalanx._session import session_for_shell
    from phalanx.fit import FitOptions

    with pytest.raises(NameError, match="did you mean 'ytr'"):
        session_for_shell(names).distributed_fit("pass", FitOptions.build(shard="Xtr,ytrr"),
                                                 names.user_ns)


def test_a_cell_that_may_bind_anything_is_not_refused_for_its_return(names):
    """exec, globals() or a star import may define the name: the engines' own check judges."""
    from phalanx.fit.analysis._precheck import check_returns

    for body in ("exec('out = 1')", "globals()['out'] = 1", "from math import *"):
        check_returns(body, ["out"], {})
    check_returns("def f():\n    global out\n    out = 1\nf()\n", ["out"], {})
    # A notebook name the cell does not read may come with a shipped function's globals.
    check_returns("fit()\n", ["model"], {"fit": print, "model": 1})
    with pytest.raises(NameError, match="--return 'out'"):
        check_returns("x = 1\n", ["out"], {"model": 1})


def test_the_reported_case_with_a_cluster_running(two_engines, names, capsys):
    text = shown(names, capsys, "%%distributed_fit --shard Xtr,ytrr --return model\n"
                                "print(len(Xtr), model)\n")
    assert text == ("UsageError: --shard names 'ytrr', not defined in the notebook; "
                    "did you mean 'ytr'?")
    with pytest.raises(UsageError, match="'modle'.*did you mean 'model'"):
        run_cell(names, "%%distributed_fit --shard Xtr,ytr\nprint(modle)\n")
