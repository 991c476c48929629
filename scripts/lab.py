"""Start JupyterLab on a notebook: the command behind ``make lab``.

    python scripts/lab.py [--work-dir DIR] notebooks/01-quickstart.ipynb [any `jupyter lab` option...]

It is ``jupyter lab`` with three differences a first-time user notices:

* with ``--work-dir DIR`` it opens a working copy of the notebook's folder in DIR (made where DIR
  lacks a file, :mod:`notebook_copy`), never the tracked notebook itself;

* it also runs as root (most containers and many cloud notebook images run the shell as root):
  ``--allow-root`` is added then, and only then;
* once the server listens, it prints the notebook's address with its token and how to stop the
  server, as the last lines on the screen rather than in the middle of the start-up log.
"""

from __future__ import annotations

import os
import sys
from urllib.parse import quote, urlencode

from jupyter_server.utils import url_path_join
from jupyterlab.labapp import LabApp
from notebook_copy import open_copy


def lab_argv(args: list[str], uid: int) -> list[str]:
    """The ``jupyter lab`` arguments for a user with id ``uid``.

    >>> lab_argv(["nb.ipynb"], uid=0)
    ['nb.ipynb', '--allow-root']
    >>> lab_argv(["nb.ipynb"], uid=1000)
    ['nb.ipynb']
    """
    wants_root_flag = uid == 0 and not any(a.startswith("--allow-root") for a in args)
    return [*args, "--allow-root"] if wants_root_flag else list(args)


def notebook_url(server) -> str:
    """Where the server shows its notebook (or its file browser), on loopback, with the token."""
    path = url_path_join(server.base_url, "lab")
    if server.file_to_run:
        relative = os.path.relpath(os.path.abspath(server.file_to_run), server.root_dir)
        path = url_path_join(path, "tree", *relative.split(os.sep))
    token = server.identity_provider.token
    query = f"?{urlencode({'token': token})}" if token else ""
    host = "[::1]" if ":" in server.ip else "127.0.0.1"
    scheme = "https" if server.certfile else "http"
    return f"{scheme}://{host}:{server.port}{quote(path)}{query}"


def banner(server) -> str:
    """The lines printed once the server listens."""
    return "\n".join([
        "",
        "phalanx: JupyterLab is running. Open",
        f"    {notebook_url(server)}",
        f"Stop it with Ctrl-C in this terminal (twice to skip the question), or: kill {os.getpid()}",
        "",
    ])


def main(args: list[str]) -> None:
    server = LabApp.initialize_server(argv=lab_argv(open_copy(args), os.geteuid()))
    # Called once the loop runs, i.e. after the server bound its port and logged its start-up.
    server.io_loop.add_callback(lambda: print(banner(server), flush=True))
    server.start()


if __name__ == "__main__":
    main(sys.argv[1:])
