"""The device rule through the frameworks' own code, on a machine without a GPU.

``device_standin.py`` tells each engine of a layout that it has the GPUs its pinning lists and
runs phalanx's device choice, a torchrun script's ``set_device(LOCAL_RANK)``, accelerate's
``PartialState``, Hugging Face ``TrainingArguments`` and Lightning's ``Trainer`` in one process
(imports are paid once).  Every one must pick the engine's own GPU, on a simulated 8-GPU host,
on two hosts of four and on an uneven layout; with the previous pinning (one GPU visible) the
same code fails, which shows the stand-in can tell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.cluster._gpus import assign_devices, host_gpu_order, parse_gpu_spec
from phalanx.runtime.run._device_rule import engine_views

pytestmark = pytest.mark.slow  # the frameworks import in about 15 s

pytest.importorskip("accelerate")
pytest.importorskip("transformers")
pytest.importorskip("lightning")

HERE = Path(__file__).resolve().parent
FOUR = ["0", "1", "2", "3"]


def engines_of(hosts: list[str], found: dict[str, list[str]], lightning: bool = True) -> list:
    spec = parse_gpu_spec("auto")
    devices = assign_devices(spec, hosts, found)
    views = engine_views(hosts, devices, {h: host_gpu_order(spec, g) for h, g in found.items()})
    return [{"rank": v.rank, "hosts": hosts, "env": v.environment(), "lightning": lightning,
             "view": v} for v in views]


def run_standin(engines: list) -> list[dict]:
    sent = [{k: v for k, v in e.items() if k != "view"} for e in engines]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(HERE / "device_standin.py")], input=json.dumps(sent),
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


LAYOUTS = {
    "1 host x 8 GPUs": (["a"] * 8, {"a": [str(i) for i in range(8)]}, True),
    "2 hosts x 4 GPUs": (["a"] * 4 + ["b"] * 4, {"a": FOUR, "b": FOUR}, True),
    # Lightning needs the same number of devices on every node (as under torchrun)
    "uneven: 3 engines on a, 1 on b": (["a", "a", "a", "b"], {"a": FOUR, "b": FOUR}, False),
}


# The previous pinning: each engine saw only its own GPU, as cuda:0.  LOCAL_RANK 1 of a host:
PINNED_ALONE = {"rank": 1, "hosts": ["a", "a"], "lightning": True,
                "env": {"CUDA_VISIBLE_DEVICES": "1"}}


@pytest.fixture(scope="module")
def reports() -> dict[str, tuple[list, list[dict]]]:
    """Every layout's engines through the stand-in in one process (one set of imports)."""
    everything, spans = [], {}
    for name, (hosts, found, lightning) in LAYOUTS.items():
        engines = engines_of(hosts, found, lightning)
        spans[name] = (len(everything), engines)
        everything += engines
    spans["pinned alone"] = (len(everything), [PINNED_ALONE])
    everything.append(PINNED_ALONE)
    got = run_standin(everything)
    assert len(got) == len(everything)
    return {name: (engines, got[start:start + len(engines)])
            for name, (start, engines) in spans.items()}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_framework_picks_the_engines_own_gpu(reports, layout):
    engines, got = reports[layout]
    for engine, report in zip(engines, got):
        view = engine["view"]
        own = f"cuda:{view.own_index}"
        assert report["rank"] == view.rank
        expected = {"phalanx", "cuda", "torchrun", "accelerate", "transformers"}
        assert set(report["picks"]) == expected | ({"lightning"} if engine["lightning"] else set())
        assert set(report["picks"].values()) == {own}, (layout, view.rank, report["picks"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_local_main_process_is_one_engine_a_host(reports, layout):
    engines, got = reports[layout]
    for host in {e["view"].host for e in engines}:
        mains = [r["rank"] for e, r in zip(engines, got) if e["view"].host == host and r["local_main"]]
        assert len(mains) == 1, (layout, host, mains)


def test_with_one_gpu_visible_per_engine_the_second_engine_breaks(reports):
    """The previous pinning: torchrun's and Lightning's cuda:LOCAL_RANK is an invalid device
    ordinal on LOCAL_RANK 1 (accelerate copes: it takes LOCAL_RANK modulo the GPUs it sees)."""
    [report] = reports["pinned alone"][1]
    picks = report["picks"]
    assert picks["phalanx"] == picks["cuda"] == picks["accelerate"] == "cuda:0"
    assert "invalid device ordinal" in picks["torchrun"]
    assert "invalid device ordinal" in picks["lightning"]
