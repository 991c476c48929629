"""Content fingerprints: values, not identities, decide what changed."""

import numpy as np
import pytest
from phalanx.network._fingerprint import (
    fingerprint,
    n_rows,
    param_fingerprints,
    scalar_params,
    select_rows,
)
from sklearn.ensemble import BaggingRegressor
from sklearn.preprocessing import FunctionTransformer
from sklearn.tree import DecisionTreeRegressor


def test_equal_values_equal_fingerprints_and_any_change_shows():
    a = np.arange(12.0).reshape(3, 4)
    assert fingerprint(a) == fingerprint(a.copy())
    b = a.copy()
    b[2, 3] += 1e-12
    assert fingerprint(b) != fingerprint(a)
    assert fingerprint(a) != fingerprint(a.astype(np.float32))   # dtype is content
    assert fingerprint(a) != fingerprint(a.reshape(4, 3))        # and so is shape
    assert fingerprint(a.T) == fingerprint(np.ascontiguousarray(a.T))


def test_in_place_mutation_changes_the_fingerprint():
    a = np.zeros(5)
    before = fingerprint(a)
    a[3] = 1.0
    assert fingerprint(a) != before


def test_containers_hash_deeply_and_dicts_ignore_insertion_order():
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1, "b": [1, 2]}) != fingerprint({"a": 1, "b": [1, 3]})
    assert fingerprint((1, 2)) != fingerprint([1, 2])
    assert fingerprint(1) != fingerprint(1.0) != fingerprint(True)
    assert fingerprint({1, 2}) == fingerprint({2, 1})


def test_nested_estimator_params_are_seen_through_set_params():
    outer = BaggingRegressor(DecisionTreeRegressor(max_depth=2))
    before = param_fingerprints(outer)
    outer.set_params(estimator__max_depth=5)
    after = param_fingerprints(outer)
    assert [k for k in before if before[k] != after[k]] == ["estimator"]
    outer.set_params(estimator__max_depth=2)
    assert param_fingerprints(outer) == before


def test_array_inside_a_dict_param_mutated_in_place():
    weights = np.array([1.0, 2.0])
    ft = FunctionTransformer(np.multiply, kw_args={"w": weights})
    before = param_fingerprints(ft)
    weights[0] = 7.0
    assert param_fingerprints(ft)["kw_args"] != before["kw_args"]
    assert param_fingerprints(ft)["func"] == before["func"]


def test_functions_and_lambdas_have_stable_fingerprints():
    f = lambda v: v + 1  # noqa: E731
    assert fingerprint(f) == fingerprint(f)
    assert fingerprint(np.multiply) != fingerprint(np.add)


def test_scalar_params_keep_only_scalars():
    params = scalar_params(BaggingRegressor(DecisionTreeRegressor(), n_estimators=7))
    assert params["n_estimators"] == 7
    assert "estimator" not in params


@pytest.mark.parametrize("data, rows, expected", [
    (np.arange(5), [4, 0], [4, 0]),
    (np.arange(5), slice(1, 3), [1, 2]),
    ([10, 20, 30], [2], [30]),
    ((10, 20, 30), slice(0, 2), (10, 20)),
])
def test_select_rows(data, rows, expected):
    out = select_rows(data, rows)
    assert list(out) == list(expected)
    assert type(out) is type(data)


def test_select_rows_none_is_identity_and_n_rows():
    a = np.ones((4, 2))
    assert select_rows(a, None) is a
    assert n_rows(a) == 4 and n_rows([1, 2]) == 2 and n_rows(3) is None


def test_large_buffers_hash_in_chunks_and_still_see_every_byte(monkeypatch):
    import phalanx.network._fingerprint as fp

    monkeypatch.setattr(fp, "_PARALLEL", 1024)
    monkeypatch.setattr(fp, "_CHUNK", 256)
    a = np.arange(1000.0)          # 8000 bytes: 32 chunks on threads
    assert fingerprint(a) == fingerprint(a.copy())
    for i in (0, 31, 32, 999):     # first, chunk edges, last
        b = a.copy()
        b[i] += 0.5
        assert fingerprint(b) != fingerprint(a)


def test_a_fast_digest_when_available_still_sees_every_byte(monkeypatch):
    import hashlib

    import phalanx.network._fingerprint as fp

    used = []

    def stand_in(buf):   # plays xxhash's part: any strong digest of the whole buffer
        used.append(buf.nbytes)
        return hashlib.sha256(buf).digest()

    monkeypatch.setattr(fp, "_fast_digest", lambda: stand_in)
    a = np.arange(20000.0)   # 160 kB: above the fast-digest threshold
    before = fingerprint(a)
    a[12345] += 1.0
    assert fingerprint(a) != before and used == [a.nbytes, a.nbytes]
    assert fingerprint(np.arange(10.0)) == fingerprint(np.arange(10.0)) and len(used) == 2
