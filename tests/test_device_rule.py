"""The device rule on multi-GPU hosts (``runtime/run/_device_rule.py``), computed for whole layouts.

For each layout: every engine of a host sees the same GPUs, its own at index ``LOCAL_RANK``;
``"cuda"`` (phalanx sets the current device), ``cuda:{LOCAL_RANK}``, accelerate, Hugging Face
``Trainer`` and Lightning all pick that one; no two engines of a host share a GPU; each host has
exactly one ``LOCAL_RANK`` 0 (local main process first runs once a host); and an engine reading
its own environment finds the same GPU.  ``test_device_rule_frameworks.py`` drives the real
frameworks over the same views."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phalanx.cluster._gpus import assign_devices, host_gpu_order, parse_gpu_spec
from phalanx.cluster._registration import _devices_of_replaced
from phalanx.runtime.run._device_rule import (FRAMEWORKS, EngineView, engine_views,
                                          foreign_device_message, own_gpu_index, pinning_env)
from phalanx.runtime.adapters.torchrun import torchrun_env

EIGHT = [str(i) for i in range(8)]
FOUR = ["0", "1", "2", "3"]

# name: (--gpus, host of each rank, each host's GPUs as the kernel or its engines found them)
LAYOUTS = {
    "1 host x 8 GPUs": ("auto", ["a"] * 8, {"a": EIGHT}),
    "2 hosts x 4 GPUs": ("auto", ["a"] * 4 + ["b"] * 4, {"a": FOUR, "b": FOUR}),
    "2 hosts, ranks interleaved (MPI round robin)": ("auto", ["a", "b"] * 4,
                                                     {"a": FOUR, "b": FOUR}),
    "uneven: 3 engines on a, 1 on b": ("auto", ["a", "a", "a", "b"], {"a": FOUR, "b": FOUR}),
    "uneven: hosts with 8 and 2 GPUs, all used": ("auto", ["a"] * 8 + ["b"] * 2,
                                                  {"a": EIGHT, "b": ["0", "1"]}),
    "2 engines on an 8-GPU host": ("auto", ["a", "a"], {"a": EIGHT}),
    "--gpus 6,7 on an 8-GPU host": ("6,7", ["a", "a"], {"a": EIGHT}),
    "--gpus 2,0 (reversed)": ("2,0", ["a", "a"], {"a": ["0", "1", "2"]}),
    "a batch job's CUDA_VISIBLE_DEVICES=4,5,6,7": ("auto", ["a"] * 4, {"a": ["4", "5", "6", "7"]}),
}


def views_of(layout: str) -> list[EngineView]:
    gpus, hosts, found = LAYOUTS[layout]
    spec = parse_gpu_spec(gpus)
    devices = assign_devices(spec, hosts, found)
    return engine_views(hosts, devices, {h: host_gpu_order(spec, g) for h, g in found.items()})


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_framework_picks_the_engines_own_gpu(layout):
    for view in views_of(layout):
        picks = view.framework_devices()
        assert set(picks) == set(FRAMEWORKS)
        assert set(picks.values()) == {f"cuda:{view.own_index}"}, (view, picks)
        assert view.own_index == view.local_rank


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_two_engines_of_a_host_share_a_gpu_and_each_sees_its_peers(layout):
    views = views_of(layout)
    for host in {v.host for v in views}:
        mine = [v for v in views if v.host == host]
        physical = [v.visible[v.own_index] for v in mine]
        assert len(set(physical)) == len(mine)
        assert len({v.visible for v in mine}) == 1            # one numbering on the host
        assert set(physical) <= set(mine[0].visible)          # NCCL can check P2P with CUDA


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torchruns_host_variables_hold_so_local_main_runs_once_a_host(layout):
    views = views_of(layout)
    hosts = [v.host for v in views]
    for view in views:
        env = torchrun_env(view.rank, len(views), hosts, "r", environ={})
        assert (str(view.local_rank), str(view.local_world_size), str(view.group_rank)) == (
            env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"])
    for host in set(hosts):
        local = sorted(v.local_rank for v in views if v.host == host)
        assert local == list(range(len(local)))               # one LOCAL_RANK 0 per host


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_engine_finds_its_gpu_in_its_own_environment(layout):
    for view in views_of(layout):
        env = view.environment()
        assert env["CUDA_VISIBLE_DEVICES"] == view.cuda_visible_devices
        # without LOCAL_RANK: the metrics thread asks this way
        assert own_gpu_index(env) == view.own_index


def test_the_concrete_views_of_two_hosts_with_four_gpus():
    views = views_of("2 hosts x 4 GPUs")
    assert [(v.rank, v.host, v.local_rank, v.group_rank, v.cuda_visible_devices, v.gpu)
            for v in views] == [(r, "ab"[r // 4], r % 4, r // 4, "0,1,2,3", str(r % 4))
                                for r in range(8)]
    assert {v.local_world_size for v in views} == {4}


def test_uneven_hosts_count_their_own_engines():
    views = views_of("uneven: 3 engines on a, 1 on b")
    assert [(v.local_rank, v.local_world_size, v.group_rank) for v in views] == [
        (0, 3, 0), (1, 3, 0), (2, 3, 0), (0, 1, 1)]
    assert views[3].framework_devices()["lightning"] == "cuda:0"


def test_named_gpus_are_seen_in_the_order_given():
    views = views_of("--gpus 2,0 (reversed)")
    assert [(v.cuda_visible_devices, v.gpu, v.own_index) for v in views] == [
        ("2,0", "2", 0), ("2,0", "0", 1)]


def test_the_previous_layout_broke_the_rule_on_a_second_gpu():
    """One GPU visible per engine: LOCAL_RANK 1 asks for cuda:1, which it cannot see."""
    second = EngineView(rank=1, host="a", gpu="1", visible=("1",), local_rank=1,
                        local_world_size=2, group_rank=0)
    picks = second.framework_devices()
    assert picks["cuda"] == picks["accelerate"] == "cuda:0"   # accelerate takes it modulo
    assert picks["torchrun"] == picks["lightning"] == "cuda:1"   # invalid device ordinal


def test_cpu_engines_see_no_gpu():
    views = engine_views(["a", "a"], [None, None], {"a": []})
    assert all(v.framework_devices() == dict.fromkeys(FRAMEWORKS, "cpu") for v in views)
    assert views[0].environment() == {"CUDA_VISIBLE_DEVICES": ""}
    assert own_gpu_index({"CUDA_VISIBLE_DEVICES": ""}, local_rank=1) is None
    assert own_gpu_index({"CUDA_VISIBLE_DEVICES": "-1"}) is None


def test_engines_started_by_hand_follow_torchruns_convention():
    assert own_gpu_index({"CUDA_VISIBLE_DEVICES": "3"}, local_rank=1) == 0   # pinned alone
    assert own_gpu_index({}, local_rank=2) == 2                               # all visible
    assert own_gpu_index({"CUDA_VISIBLE_DEVICES": "0,1,2"}, local_rank=1) == 1


def test_pinning_refuses_a_gpu_outside_the_list():
    assert pinning_env("3") == {"CUDA_VISIBLE_DEVICES": "3", "PHALANX_GPU": "3"}
    with pytest.raises(ValueError, match="GPU 3 is not among"):
        pinning_env("3", ["0", "1"])


def test_a_hand_written_cuda_0_on_a_second_engine_is_named_with_its_fix():
    message = foreign_device_message(rank=5, local_rank=1, local_world_size=4, used=0, own=1,
                                     visible=FOUR)
    assert message is not None
    for part in ("rank 5", "LOCAL_RANK 1", "cuda:0", "GPU 0", "cuda:1", 'device="cuda"',
                 "map_location"):
        assert part in message
    assert foreign_device_message(5, 1, 4, used=1, own=1) is None        # its own
    assert foreign_device_message(1, 1, 2, used=5, own=1) is None        # no engine's GPU


def test_a_replacement_takes_the_gpu_of_the_engine_it_replaces():
    old = [SimpleNamespace(host="a", device="1"), SimpleNamespace(host="b", device="3")]
    new = [SimpleNamespace(host="b"), SimpleNamespace(host="a")]
    assert _devices_of_replaced(old, new) == ["3", "1"]
    assert _devices_of_replaced(old[:1], [SimpleNamespace(host="c")]) == ["1"]


def test_the_check_at_the_first_step_raises_on_a_peers_gpu_only():
    torch = pytest.importorskip("torch")
    from phalanx.runtime.run._own_gpu import ForeignDeviceError, check_training_device

    spec = SimpleNamespace(rank=1, world_size=2, group=SimpleNamespace(hosts=("a", "a")),
                           run_id="r")
    run = SimpleNamespace(device=torch.device("cuda", 1), rank=1, spec=spec)
    on = lambda index: SimpleNamespace(device=torch.device("cuda", index))  # noqa: E731
    check_training_device(run, [on(1), torch.zeros(1)])
    with pytest.raises(ForeignDeviceError, match=r"rank 1 \(LOCAL_RANK 1\) computes on cuda:0"):
        check_training_device(run, [on(0)])
    check_training_device(SimpleNamespace(device=torch.device("cpu"), rank=1, spec=spec), [on(0)])
