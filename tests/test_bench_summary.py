"""The benchmarks' ratio table says what was measured: a miss never reads as its target."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _summary import _row, render_markdown, summarize, teardown_note  # noqa: E402


def _table_row(value: float, target: str, met: bool) -> str:
    table = render_markdown({"kind": "test"}, [_row("throughput", "m", value, target, met)])
    return table.splitlines()[-1]


def test_a_ratio_just_under_its_target_shows_the_digit_that_misses():
    assert _table_row(0.9696, ">= 0.97x", False) == "| throughput | m | 0.9696 | >= 0.97x | **no** |  |"


def test_other_ratios_keep_three_significant_digits():
    assert "| 0.97 |" in _table_row(0.9696, "reported", None)
    assert "| 0.972 |" in _table_row(0.97204, ">= 0.97x", True)
    assert "| 28 |" in _table_row(28.0, "<= 15 ms", False)


def _frameworks_section(crashed: int = 0) -> dict:
    def stats(median: float) -> dict:
        return {"median": median, "min": median, "max": median, "runs": 4, "samples": [median] * 4}

    def framework(label: str, ratios: list[float], magic: float, torchrun: float) -> dict:
        return {"label": label, "steps": 100, "magic_steps_per_s": stats(magic),
                "torchrun_steps_per_s": stats(torchrun), "magic_cpu_ms_per_step": stats(21.0),
                "torchrun_cpu_ms_per_step": stats(20.5), "kernel_cpu_s_per_cell": stats(0.4),
                "magic_vs_torchrun": {"ratio": sorted(ratios)[len(ratios) // 2], "min": min(ratios),
                                      "max": max(ratios), "pairs": ratios}}

    # in the order of the results file (sorted keys): the table keeps the section's own order
    return {"frameworks": {"lightning": framework("Lightning", [0.9, 0.95, 0.96], 95.0, 100.0),
                           "hf_trainer": framework("HF Trainer", [0.99, 1.02, 0.98], 40.0, 39.5)},
            "rerun": {"warm_cell_s": stats(0.93), "fresh_torchrun_s": stats(14.0),
                      "fresh_vs_warm": {"ratio": 15.1, "min": 13.0, "max": 16.0, "pairs": []}},
            "torchrun": {"launches": 8, "crashed_at_teardown": crashed, "crashes": []}}


def test_the_frameworks_rows_give_each_paired_ratio_against_its_target_and_the_rerun_as_reported():
    rows = summarize({"frameworks": _frameworks_section()})
    assert [(r["name"], r["value"], r["target"], r["met"]) for r in rows] == [
        ("HF Trainer, 2 engines vs torchrun: steps/s", 0.99, ">= 0.97x", True),
        ("Lightning, 2 engines vs torchrun: steps/s", 0.95, ">= 0.97x", False),
        ("fresh torchrun launch of the Trainer script / warm re-run of its cell (wall, start to "
         "done)", 15.1, "reported", None)]
    assert rows[0]["detail"] == ("median of 3 paired ratios, spread 0.980-1.020; 40.0 vs 39.5 "
                                 "steps/s; rank 0's CPU per step 21.00 vs 20.50 ms, the "
                                 "kernel's 0.40 s a cell")
    assert rows[2]["detail"] == "14.00 s vs 0.93 s"


def test_a_torchrun_launch_that_crashed_at_teardown_after_its_figure_is_said_in_the_rows():
    rows = summarize({"frameworks": _frameworks_section(crashed=1)})
    assert all(r["detail"].endswith("; 1 of 8 torchrun launches crashed at teardown after their "
                                    "figure") for r in rows)
    assert teardown_note(None) == "" and teardown_note({"launches": 3, "crashed_at_teardown": 0}) == ""


def test_the_throughput_and_latency_rows_say_their_torchrun_crashes_too():
    record = {"launches": 7, "crashed_at_teardown": 2}
    latency = {"cold_torchrun_s": {"median": 6.2}, "warm_rerun_s": {"median": 0.028},
               "speedup": 221.0, "torchrun": record}
    sps = {k: {"median": 1000.0, "runs": 7} for k in ("plain", "torchrun_ddp_2")}
    throughput = {"samples_per_s": sps, "torchrun": record,
                  "ratios": {"magic_1_vs_plain": 0.95, "magic_2_wrap_vs_torchrun_ddp": 0.98,
                             "scaling_efficiency_allreduce": 0.4, "scaling_efficiency_torchrun": 0.2}}
    rows = summarize({"latency": latency, "throughput": throughput})
    said = "; 2 of 7 torchrun launches crashed at teardown after their figure"
    assert rows[0]["detail"] == "28.0 ms vs 6.20 s" + said
    by_name = {r["name"]: r["detail"] for r in rows}
    assert by_name["2 workers wrap() (DDP) vs torchrun+DDP"] == "baseline 1000 samples/s" + said
    assert by_name["1 worker vs plain loop"] == "baseline 1000 samples/s"   # no torchrun in it


def test_a_frameworks_ratio_is_judged_by_its_interval_and_one_inside_the_noise_is_undecided():
    from _common import paired

    section = _frameworks_section()
    pairs = {"lightning": [0.80, 1.10, 0.90, 1.05, 0.95, 1.00, 0.85],   # wide: holds 0.97
             "hf_trainer": [1.00, 0.99, 1.01, 0.995, 1.005, 0.998, 1.002]}  # narrow, above it
    for name, ratios in pairs.items():
        section["frameworks"][name]["magic_vs_torchrun"] = paired(ratios, [1.0] * len(ratios))
    rows = {r["name"]: r for r in summarize({"frameworks": section})}
    trainer = rows["HF Trainer, 2 engines vs torchrun: steps/s"]
    lightning = rows["Lightning, 2 engines vs torchrun: steps/s"]
    assert trainer["met"] is True and "holds the target" not in trainer["detail"]
    assert lightning["met"] is None   # a median of 0.95 alone would read as a miss
    assert "95% interval of the median 0.850-1.050 holds the target: undecided" in lightning["detail"]
    assert "| 0.95 | >= 0.97x | - |" in render_markdown({"kind": "test"}, [lightning])
    below = paired([0.90, 0.91, 0.92, 0.90, 0.93], [1.0] * 5)
    section["frameworks"]["lightning"]["magic_vs_torchrun"] = below
    rows = {r["name"]: r for r in summarize({"frameworks": section})}
    assert rows["Lightning, 2 engines vs torchrun: steps/s"]["met"] is False


def _cost(process: float, wall: float, interval: list[float] | None = None) -> dict:
    whole = {"fastest": process, "paired_median": process - 0.01}
    own = {"fastest": process + 0.01, "paired_median": process, "ci95": interval}
    return {"process_us": whole, "wall_us": {"fastest": wall, "paired_median": wall},
            "instructions": None, **({"own_us": own} if interval else {})}


def test_the_step_cost_rows_judge_cpu_time_by_its_interval_and_say_the_rest_beside():
    section = {"ratios": {"run_vs_engine_1": _cost(0.98, 0.85, [0.975, 0.99]),
                          "wrap_run_vs_engine_ddp_2": _cost(0.95, 1.02, [0.90, 1.01]),
                          "engine_vs_plain_1": _cost(1.01, 0.99, [0.99, 1.02])},
               "fixed_cost": {
                   "1 worker": {"added_us": 10.0, "interval_us": [8.0, 12.0],
                                "pairs_us": [10.0] * 4, "step_us": 600.0,
                                "implied_ratio": 600 / 610},
                   "2 workers wrap()": {"added_us": 60.0, "interval_us": [45.0, 70.0],
                                        "pairs_us": [60.0] * 4, "step_us": 1100.0,
                                        "implied_ratio": 1100 / 1160,
                                        "peer_wait": {"rank1_busy_us": 50,
                                                      "rank0_added_us": 65.0}}},
               "components": {"1 worker": {
                   "components": {"optimizer step hooks": {"us": 4.0, "calls": 2.0},
                                  "guard": {"us": 0.5, "calls": 1.0}},
                   "meter_us_per_step": 1.5, "process_us": 700.0}}}
    rows = summarize({"step_cost": section})
    assert [(round(r["value"], 3), r["target"], r["met"]) for r in rows] == [
        (0.98, ">= 0.97x", True), (0.95, ">= 0.97x", None), (1.01, "reported", None),
        (0.984, ">= 0.97x", True), (0.948, "reported", None), (4.5, "reported", None)]
    assert rows[0]["detail"].startswith("95% interval 0.975-0.990; fastest 0.990; whole process")
    assert "holds the target: undecided" in rows[1]["detail"]
    assert "the run adds 10.0 us a step (95% interval 8.0-12.0" in rows[3]["detail"]
    # with a peer the figure counts its lateness too: reported, with the calibration beside
    assert "50 us of work added to rank 1's steps alone added 65 us to rank 0's" in rows[4]["detail"]
    assert rows[5]["detail"] == ("optimizer step hooks 4.0, guard 0.5; the meter's own 1.5 us "
                                 "included; step 700 us")


def test_the_counted_python_work_of_a_step_is_reported_beside_the_cpu_times():
    from _step_trace import added

    in_run = {"opcodes": {"phalanx": 500.0, "torch": 3207.0, "other": 167.5},
              "calls": {"phalanx": 18.0, "torch": 134.0, "other": 13.0}}
    in_engine = {"opcodes": {"torch": 3183.0, "other": 162.0}, "calls": {"torch": 134.0, "other": 13.0}}
    section = {"ratios": {}, "components": {},
               "python_work": {"2 workers wrap()": {"steps": 200, "in_run": in_run,
                                                    "in_engine": in_engine,
                                                    "added": added(in_run, in_engine)}}}
    [row] = summarize({"step_cost": section})
    assert (row["value"], row["target"], row["met"]) == (529.5, "reported", None)
    assert row["detail"] == ("phalanx's code 500, torch's 24 (the branches its hooks take); 18.0 "
                             "Python calls; the step without a run: 3183 bytecodes of torch's; "
                             "over 200 steps of the fixed-cost model")


def test_the_counted_work_of_a_step_is_the_same_every_time_and_says_whose_code_ran():
    import torch
    from _step_trace import traced_work

    net = torch.nn.Linear(2, 2)

    def step() -> None:
        net(torch.zeros(1, 2))

    first = traced_work(step, 5)
    assert first == traced_work(step, 5)  # a count, not a time: no machine moves it
    assert first["opcodes"]["torch"] > first["opcodes"]["other"] > 0  # Module.__call__ and step()
    assert first["calls"]["other"] == 1.0 and "phalanx" not in first["calls"]


def test_step_cost_results_from_before_the_interval_are_judged_by_their_median():
    section = {"ratios": {"run_vs_engine_1": _cost(0.98, 0.85),
                          "wrap_run_vs_engine_ddp_2": _cost(0.95, 1.02),
                          "engine_vs_plain_1": _cost(1.01, 0.99)}, "components": {}}
    rows = summarize({"step_cost": section})
    # their whole-process paired medians: 0.97 (at the target) and 0.94
    assert [r["met"] for r in rows] == [True, False, None]
    assert [round(r["value"], 3) for r in rows] == [0.97, 0.94, 1.0]


def test_the_rerun_cpu_row_is_decided_by_its_paired_blocks_interval():
    from _summary_runs import _rerun_vs_round_trip_cell

    cpu = {"warm_rerun_cpu_s": 0.039, "bare_round_trip_cell_cpu_s": 0.016,
           "empty_cell_cpu_s": 0.0035, "bare_round_trip_cpu_s": 0.0096, "block_cells": 10}
    section = {"bare_round_trip_cell_s": {"median": 0.0136, "runs": 20},
               "rerun_vs_bare_round_trip_cell": 2.47, "cpu": cpu,
               "rerun_cpu_vs_bare_round_trip_cell_cpu": 2.44}
    # results written before the blocks were paired: the ratio of means alone decides
    assert _rerun_vs_round_trip_cell(section, 0.0373)[1]["met"] is True
    straddling = [2.3, 2.4, 2.5, 2.6, 2.7, 2.45, 2.55, 2.35]
    row = _rerun_vs_round_trip_cell({**section, "rerun_cpu_block_ratios": straddling}, 0.0373)[1]
    assert row["met"] is None and "holds the target: undecided" in row["detail"]
    assert row["detail"].startswith("8 paired blocks of 10 cells, their ratios' median 2.48")
    above = [r + 0.5 for r in straddling]
    row = _rerun_vs_round_trip_cell({**section, "rerun_cpu_block_ratios": above}, 0.0373)[1]
    assert row["met"] is False
    below = [r - 0.5 for r in straddling]
    assert _rerun_vs_round_trip_cell({**section, "rerun_cpu_block_ratios": below}, 0.0373)[1]["met"]


def _gpu_ratio(wall: float, interval: list[float], blocks: int = 8) -> dict:
    return {"wall_us": {"paired_median": wall, "ci95": interval, "paired": [wall] * blocks},
            "thread_us": {"paired_median": wall + 0.01, "ci95": [interval[0], interval[1]],
                          "paired": [wall] * blocks}}


def test_the_gpu_step_rows_judge_wall_time_by_its_interval_and_skip_a_machine_without_cuda():
    section = {"ratios": {"wrap_run_vs_torchrun_ddp": _gpu_ratio(0.92, [0.887, 1.039]),
                          "wrap_run_vs_engine_ddp": _gpu_ratio(0.94, [0.90, 0.96]),
                          "engine_ddp_vs_torchrun_ddp": _gpu_ratio(0.99, [0.95, 1.03])},
               "profiled": {"run_wall_us": 1676.0, "engine_wall_us": 1671.0, "functions": [
                   {"function": "_zero_change.py:189:_after_step", "added_us": 6.5}]},
               "components": {"wall": {"components": {"guard": {"us": 1.5, "calls": 1.0},
                                                      "gradient hooks": {"us": 0.5, "calls": 2}},
                                       "wall_us": 1380.0}}}
    rows = summarize({"gpu_step": section})
    assert [(round(r["value"], 3), r["target"], r["met"]) for r in rows] == [
        (0.92, ">= 0.97x", None), (0.94, ">= 0.97x", False), (0.99, "reported", None),
        (5.0, "reported", None), (2.0, "reported", None)]
    assert "0.887-1.039 holds the target: undecided" in rows[0]["detail"]
    assert "_after_step +6.5" in rows[3]["detail"]
    assert rows[4]["detail"] == "guard 1.5, gradient hooks 0.5; step 1380 us wall"
    assert summarize({"gpu_step": {"skipped": "no CUDA device on this machine"}}) == []
