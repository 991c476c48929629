"""GPU assignment decisions (pure): one distinct device per engine, clear errors otherwise."""

import pytest

from phalanx.cluster import GpuSpecError, assign_devices, parse_gpu_spec
from phalanx.cluster._gpus import default_engine_count, pinning_env, visible_gpus


def test_auto_gives_each_engine_its_own_host_local_device():
    devices = assign_devices(parse_gpu_spec("auto"), ["a", "a", "b", "b"],
                             {"a": ["0", "1"], "b": ["0", "1"]})
    assert devices == ["0", "1", "0", "1"]


def test_auto_without_gpus_gives_cpu_engines():
    assert assign_devices(parse_gpu_spec("auto"), ["a", "a"], {"a": []}) == [None, None]


def test_auto_refuses_more_engines_than_gpus_on_a_host():
    with pytest.raises(GpuSpecError, match="3 engines on host a but it has 2 GPU"):
        assign_devices(parse_gpu_spec("auto"), ["a"] * 3, {"a": ["0", "1"]})


def test_explicit_list_pins_listed_devices_in_order():
    assert assign_devices(parse_gpu_spec("2,0"), ["a", "a"], {"a": ["0", "1", "2"]}) == ["2", "0"]


def test_explicit_list_names_missing_devices():
    with pytest.raises(GpuSpecError, match="device\\(s\\) 5 but host a has: 0, 1"):
        assign_devices(parse_gpu_spec("0,5"), ["a", "a"], {"a": ["0", "1"]})


def test_none_hides_gpus():
    assert assign_devices(parse_gpu_spec("none"), ["a"], {"a": ["0"]}) == [None]
    assert pinning_env(None) == {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize("text", ["gpu0", "0,,1", "0,0", "-1", "all"])
def test_bad_specs_are_rejected_with_the_valid_forms(text):
    with pytest.raises(GpuSpecError):
        parse_gpu_spec(text)


def test_default_count_is_one_engine_per_gpu_else_two():
    assert default_engine_count(parse_gpu_spec("auto"), ["0", "1", "2"]) == 3
    assert default_engine_count(parse_gpu_spec("auto"), []) == 2
    assert default_engine_count(parse_gpu_spec("0,1"), ["0", "1", "2"]) == 2


def test_visible_gpus_respects_cuda_visible_devices_without_touching_cuda():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3,5"}) == ["3", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
