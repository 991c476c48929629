"""The README's Binder and nbviewer links, derived from the one public address of the repository.

The address is ``[project.urls] Repository`` in pyproject.toml.  Change it there, then

    python docs/links.py        # (make links) rewrites the README's links to match

``tests/test_readme.py`` fails while a link disagrees with pyproject.toml.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GITHUB = re.compile(r"^https://github\.com/([^/\s]+)/([^/\s]+?)/?$")
# What a link into this repository looks like on each service; group 1 is the repository part.
SERVICES = {
    "binder": re.compile(r"https://mybinder\.org/v2/gh/([^/\s)]+/[^/\s)]+)/"),
    "nbviewer": re.compile(r"https://nbviewer\.org/github/([^/\s)]+/[^/\s)]+)/"),
}


def repository(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """``owner/name`` from pyproject's ``Repository`` URL (a GitHub address)."""
    # A plain match, not a TOML parser: this also runs on Pythons without tomllib (3.10).
    line = re.search(r'^Repository\s*=\s*"([^"]*)"', pyproject.read_text(), re.M)
    url = line.group(1) if line else "(missing)"
    found = GITHUB.match(url)
    if not found:
        raise ValueError(f"pyproject.toml [project.urls] Repository = {url!r}: expected "
                         "https://github.com/OWNER/NAME, the repository's public address")
    return f"{found.group(1)}/{found.group(2)}"


def binder_url(repo: str, notebook: str) -> str:
    """Binder's JupyterLab on ``notebook``.

    >>> binder_url("me/phalanx", "notebooks/01-quickstart.ipynb")
    'https://mybinder.org/v2/gh/me/phalanx/HEAD?urlpath=lab/tree/notebooks/01-quickstart.ipynb'
    """
    return f"https://mybinder.org/v2/gh/{repo}/HEAD?urlpath=lab/tree/{notebook}"


def nbviewer_url(repo: str, notebook: str) -> str:
    """nbviewer's rendering of ``notebook`` on the default branch.

    >>> nbviewer_url("me/phalanx", "notebooks/01-quickstart.ipynb")
    'https://nbviewer.org/github/me/phalanx/blob/HEAD/notebooks/01-quickstart.ipynb'
    """
    return f"https://nbviewer.org/github/{repo}/blob/HEAD/{notebook}"


def linked_repositories(text: str) -> set[str]:
    """Every ``owner/name`` the text's Binder and nbviewer links point at."""
    return {repo for pattern in SERVICES.values() for repo in pattern.findall(text)}


def with_repository(text: str, repo: str) -> str:
    """``text`` with every Binder and nbviewer link pointing at ``repo``."""
    text = SERVICES["binder"].sub(f"https://mybinder.org/v2/gh/{repo}/", text)
    return SERVICES["nbviewer"].sub(f"https://nbviewer.org/github/{repo}/", text)


def main() -> int:
    repo = repository()
    text = README.read_text()
    updated = with_repository(text, repo)
    if updated != text:
        README.write_text(updated)
    print(f"README links point at {repo}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
