"""The README shows the product and links to it from one address.

Its pictures exist, are PNGs and small; its Binder and nbviewer links all point at the
repository named once in pyproject.toml (``make links`` rewrites them) and at notebooks that
exist.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))

import links  # noqa: E402

README = (ROOT / "README.md").read_text()
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
MAX_IMAGE_BYTES = 400_000


def test_every_binder_and_nbviewer_link_derives_from_the_one_address():
    repo = links.repository()
    assert links.linked_repositories(README) == {repo}, "run `make links`"
    assert links.with_repository(README, repo) == README, "run `make links`"


def test_changing_the_address_in_pyproject_moves_every_link(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text((ROOT / "pyproject.toml").read_text().replace(
        f'Repository = "https://github.com/{links.repository()}"',
        'Repository = "https://github.com/someone/phalanx"'))
    moved = links.with_repository(README, links.repository(pyproject))
    assert links.linked_repositories(moved) == {"someone/phalanx"}
    assert "https://mybinder.org/v2/gh/someone/phalanx/HEAD?urlpath=lab/tree/notebooks/01-quickstart.ipynb" in moved


def test_a_bad_address_is_refused_with_what_to_write(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project.urls]\nRepository = "git@github.com:me/phalanx.git"\n')
    with pytest.raises(ValueError, match="expected https://github.com/OWNER/NAME"):
        links.repository(pyproject)


def test_binder_and_nbviewer_open_notebooks_that_exist():
    binder = re.findall(r"https://mybinder\.org/v2/gh/[^\s)]+", README)
    nbviewer = re.findall(r"https://nbviewer\.org/github/[^\s)]+", README)
    assert binder and len(nbviewer) == len(list((ROOT / "notebooks").glob("[0-9]*.ipynb")))
    for url in binder:
        target = parse_qs(urlsplit(url).query)["urlpath"][0].removeprefix("lab/tree/")
        assert (ROOT / target).is_file(), url
    for url in nbviewer:
        assert (ROOT / urlsplit(url).path.split("/blob/HEAD/", 1)[1]).is_file(), url


def test_pictures_exist_are_described_and_small():
    images = [(alt, path) for alt, path in IMAGE.findall(README) if not path.startswith("http")]
    assert {path for _, path in images} >= {"docs/images/lab-panel.png", "docs/images/run-view.png"}
    for alt, path in images:
        data = (ROOT / path).read_bytes()
        assert data.startswith(b"\x89PNG"), path
        assert len(data) < MAX_IMAGE_BYTES, f"{path}: {len(data)} bytes"
        assert len(alt) > 40, f"{path}: say what the picture shows"
