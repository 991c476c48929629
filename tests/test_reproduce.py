"""The reproducibility warning when a saved notebook's cell re-runs on another world size."""

import json

import pytest

from phalanx.fit.analysis._reproduce import ReproducibilityWarning, cell_hash, saved_manifest, warn_if_world_differs

BODY = "opt.step()\n"


def _notebook(tmp_path, world_size: int):
    output = {"output_type": "display_data", "data": {"text/plain": "run"},
              "metadata": {"phalanx": {"manifest": {"cell": cell_hash(BODY), "world_size": world_size}}}}
    nb = {"cells": [{"cell_type": "code", "source": "%%distributed_fit\n" + BODY, "outputs": [output],
                     "metadata": {}, "execution_count": 1}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "saved.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_a_saved_run_on_another_world_size_warns_and_says_why(tmp_path):
    path = _notebook(tmp_path, world_size=2)
    with pytest.warns(ReproducibilityWarning, match=r"come from 2 rank\(s\); it now runs on 3.*%cluster scale 2"):
        warn_if_world_differs(BODY, {"__session__": str(path)}, 3)


def test_same_world_size_or_no_saved_run_is_silent(tmp_path, recwarn):
    path = _notebook(tmp_path, world_size=2)
    warn_if_world_differs(BODY, {"__session__": str(path)}, 2)
    warn_if_world_differs("another cell", {"__session__": str(path)}, 3)
    warn_if_world_differs(BODY, {}, 3)
    assert not recwarn.list


def test_saved_manifest_tolerates_missing_or_broken_files(tmp_path):
    assert saved_manifest(tmp_path / "nope.ipynb", "x") is None
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{not json")
    assert saved_manifest(broken, "x") is None
