"""What each rank prints is kept per rank: rank 0's lines in the cell, the others' one click away
(a ``<details>`` per rank) and saved with the notebook.

The real-kernel test runs a small notebook with nbclient on a real 2-engine cluster, saves it and
reads the saved file back, as a person opening a shared notebook would.
"""

from __future__ import annotations

import pytest
from deadlines import hang_limit

from phalanx.fit.run._rank_output import KEEP_LINES, RankOutputs


def test_the_other_ranks_lines_are_escaped_kept_per_rank_and_the_oldest_dropped():
    outputs = RankOutputs()
    outputs.add(2, ["<b>two</b>"])
    outputs.add(1, [f"line {i}" for i in range(KEEP_LINES + 5)])
    page = outputs.bundle()["text/html"]
    assert page.index("rank 1 printed") < page.index("rank 2 printed")  # rank order
    assert f"rank 1 printed {KEEP_LINES + 5} line(s); last: <code>line {KEEP_LINES + 4}</code>" in page
    assert "… 5 earlier line(s) not kept\nline 5\n" in page and "line 4\n" not in page
    assert "&lt;b&gt;two&lt;/b&gt;" in page and "<b>two</b>" not in page
    plain = outputs.bundle()["text/plain"].splitlines()
    assert plain[0] == "[rank 1] line 5" and plain[-1] == "[rank 2] <b>two</b>"


PRINTS = """%%distributed_fit --no-widget
import sys
print(f"hello from rank {rank}")
print(f"rank {rank} squared is {rank * rank}", file=sys.stderr)
"""


@pytest.mark.cluster
@pytest.mark.slow
def test_each_ranks_lines_are_saved_with_the_notebook_rank_0_shown(tmp_path):
    import nbformat
    from kernel_support import ipc_config
    from nbclient import NotebookClient

    cells = ["%load_ext phalanx\n%cluster start -n 2 --gpus none", PRINTS, "%cluster stop"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    try:
        NotebookClient(nb, timeout=hang_limit(300), kernel_name="python3",
                       config=ipc_config()).execute()
    finally:
        path = tmp_path / "shared.ipynb"
        nbformat.write(nb, path)
    run = nbformat.read(path, as_version=4).cells[1].outputs   # as a person opening it reads it
    streams = {name: "".join(o.text for o in run if o.get("name") == name)
               for name in ("stdout", "stderr")}
    assert "[rank 0] hello from rank 0\n" in streams["stdout"]          # rank 0: in the cell
    assert "[rank 0] rank 0 squared is 0\n" in streams["stderr"]
    assert "rank 1" not in streams["stdout"] + streams["stderr"]        # the others: a click away
    [kept] = [o for o in run if "phalanx-rank-output" in o.get("data", {}).get("text/html", "")]
    page = kept.data["text/html"]
    assert page.count("<details>") == 1 and "<summary>rank 1 printed 2 line(s)" in page
    assert "hello from rank 1" in page and "rank 1 squared is 1" in page
    assert "rank 0" not in page
    assert "[rank 1] hello from rank 1" in kept.data["text/plain"]
