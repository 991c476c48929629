"""The fast tensor pickling between kernel and engines keeps what torch's own pickling keeps.

Each case compares against ``cloudpickle`` (torch's path) on the same object: the same values,
dtype, geometry, ``requires_grad``, type and storage sharing after a round trip.  The storages'
bytes travel out of band, once each; nothing else does (a numpy array comes back writable).
"""

from __future__ import annotations

import doctest
import pickle

import cloudpickle
import pytest
import torch

from phalanx.wire import _tensor_pickle
from phalanx.wire._tensor_pickle import dumps, loads

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]


def round_trip(value):
    return loads(dumps(value))


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> None:
    assert type(a) is type(b)
    assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.requires_grad) == \
        (b.dtype, b.shape, b.stride(), b.storage_offset(), b.requires_grad)
    assert torch.equal(a.detach(), b.detach())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_and_shape_comes_back_equal(dtype):
    generator = torch.Generator().manual_seed(3)
    full = (torch.rand(5, 7, generator=generator) * 100).to(dtype)
    cases = [full, full[1:4, ::2], full.t(), full[2, 3], full[:0], full[0].expand(3, 7),
             torch.zeros((), dtype=dtype)]
    for case in cases:
        same_tensor(round_trip(case), pickle.loads(cloudpickle.dumps(case)))


def test_a_loaded_tensor_behaves_like_any_other():
    loaded = round_trip(torch.arange(4.0))
    loaded.resize_(0)  # its storage is torch's own: it can grow, as out= arguments do
    torch.cat([torch.ones(3), torch.ones(3)], out=loaded)
    assert loaded.tolist() == [1.0] * 6
    assert loaded.share_memory_().is_shared()


def test_parameters_keep_their_type_and_requires_grad():
    weight = torch.nn.Parameter(torch.randn(3, 4))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    leaf = torch.randn(3, requires_grad=True)
    for value in (weight, frozen, leaf):
        same_tensor(round_trip(value), value)


def test_a_view_and_its_base_stay_one_storage():
    base = torch.arange(10.0)
    first, view, again = round_trip([base, base[3:6], base])
    assert again is first  # the same object twice is one object, as with pickle
    view[0] = -1.0
    assert first[3] == -1.0
    assert first.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()


def test_a_model_round_trips_with_tied_weights_and_buffers():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 20))
    model[2].weight = model[0].weight  # tied, as in language models
    model[1].running_mean.add_(0.5)
    copy = round_trip(model)
    assert copy[2].weight is copy[0].weight
    for (name, a), (_, b) in zip(model.state_dict().items(), copy.state_dict().items()):
        assert torch.equal(a, b), name
    tokens = torch.tensor([1, 5, 7])
    model.eval(), copy.eval()
    assert torch.equal(model(tokens), copy(tokens))


def test_what_the_fast_path_does_not_cover_takes_torchs_path():
    tagged = torch.ones(3)
    tagged.note = "kept"  # a Python attribute on a tensor
    assert round_trip(tagged).note == "kept"
    complex_view = torch.randn(3, dtype=torch.complex64).conj()
    assert torch.equal(round_trip(complex_view), complex_view)
    sparse = torch.eye(3).to_sparse()
    assert torch.equal(round_trip(sparse).to_dense(), torch.eye(3))
    non_leaf = torch.ones(2, requires_grad=True) * 2  # arrives as a leaf, as with torch's path
    same_tensor(round_trip(non_leaf), pickle.loads(cloudpickle.dumps(non_leaf)))


def test_notebook_code_still_travels_by_value():
    namespace: dict = {}
    exec("def scale(t):\n    return t * 3\n", namespace)
    scale, tensor = round_trip([namespace["scale"], torch.ones(2)])
    assert scale(tensor).tolist() == [3.0, 3.0]


def test_a_storage_travels_once_and_loads_into_its_own_writable_memory():
    big = torch.arange(1_000_000, dtype=torch.float32)
    blob = dumps({"w": big, "view": big[10:20]})
    assert big.nbytes < len(blob) < big.nbytes + 4096  # the bytes once, beside a small pickle
    loaded = loads(blob)
    assert torch.equal(loaded["w"], big) and loaded["view"].untyped_storage().data_ptr() == \
        loaded["w"].untyped_storage().data_ptr()
    loaded["w"].add_(1)  # its own memory: the blob (kept by an engine for the next run) is unchanged
    assert torch.equal(loads(blob)["w"], big)
    loaded["w"].untyped_storage().resize_(8)  # memory torch allocated can be resized


def test_numpy_arrays_stay_in_band_and_load_writable():
    import numpy as np

    arrays = loads(dumps({"X": np.ones((1000, 100)), "t": torch.ones(3)}))
    arrays["X"] -= 1.0  # a cell scaling its data in place
    assert arrays["X"].sum() == 0 and arrays["X"].flags.writeable


def test_plain_pickle_data_loads_too():
    assert loads(pickle.dumps([1, "a"])) == [1, "a"]
    assert torch.equal(loads(cloudpickle.dumps(torch.ones(2))), torch.ones(2))


def test_docstring_example():
    assert doctest.testmod(_tensor_pickle).failed == 0


def test_reducers_registered_with_copyreg_count_and_cloudpickle_s_own_come_first():
    """The pickler's dispatch table is flattened for speed: a reducer registered after import
    is still used, and where two tables name a type the first (cloudpickle's) wins."""
    import copyreg
    import logging
    from collections import ChainMap

    from phalanx.wire._tensor_pickle import flat_table

    class Registered:
        pass

    copyreg.pickle(Registered, lambda obj: (int, (7,)))
    try:
        assert loads(dumps([Registered()])) == [7]
    finally:
        copyreg.dispatch_table.pop(Registered)
    assert loads(dumps(logging.getLogger("phalanx"))) is logging.getLogger("phalanx")  # cloudpickle's
    nested = ChainMap({1: "first"}, ChainMap({1: "second", 2: "b"}, {3: "c"}))
    assert flat_table(nested) == {1: "first", 2: "b", 3: "c"}
