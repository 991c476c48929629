"""Smart-retraining decisions, one rule at a time, on plain records (no graph, no fitting)."""

import dataclasses

import pytest
from phalanx.network._retrain_rules import FitRecord, MachineState, can_update, changed_params, decide

BASE = FitRecord(model_type="sk.GBR", params={"n_estimators": "n10", "lr": "a"},
                 scalars={"n_estimators": 10, "lr": 0.1, "warm_start": True},
                 upstream={"u1": 1}, data={"s1": "d1"}, rows="all")


def trained(record=BASE):
    return MachineState(fitted=object(), n_results=1, record=record, status="fitted")


def changed(**fields):
    return dataclasses.replace(BASE, **fields)


def test_nothing_changed_skips():
    assert decide(trained(), BASE).action == "skip"


def test_never_trained_fits_even_when_frozen():
    d = decide(MachineState(), BASE, frozen=True)
    assert (d.action, d.reason) == ("fit", "never trained")


def test_frozen_trained_machine_skips_whatever_changed():
    other = changed(data={"s1": "d2"}, model_type="sk.Other")
    assert decide(trained(), other, frozen=True, force=True).action == "skip"


def test_force_fits():
    assert decide(trained(), BASE, force=True).action == "fit"


def test_estimator_type_replaced_fits():
    d = decide(trained(), changed(model_type="sk.Ridge"))
    assert d.action == "fit" and "sk.GBR -> sk.Ridge" in d.reason


def test_upstream_refitting_in_this_fit_forces_fit():
    d = decide(trained(), BASE, refitting_upstream=["pca"])
    assert (d.action, d.reason) == ("fit", "upstream 'pca' refits")


def test_upstream_new_result_since_last_fit_forces_fit():
    d = decide(trained(), changed(upstream={"u1": 2}), names={"u1": "stand"})
    assert (d.action, d.reason) == ("fit", "upstream 'stand' has a new fit result")


def test_source_data_change_fits_and_names_the_source():
    d = decide(trained(), changed(data={"s1": "other"}), names={"s1": "y"})
    assert (d.action, d.reason) == ("fit", "data of source 'y' changed")


def test_rows_change_fits_unless_previewing():
    assert decide(trained(), changed(rows="r1")).reason == "rows changed"
    assert decide(trained(), changed(rows="r1"), ignore_rows=True).action == "skip"


def test_warm_growth_updates():
    grown = changed(params={**BASE.params, "n_estimators": "n20"},
                    scalars={**BASE.scalars, "n_estimators": 20})
    d = decide(trained(), grown)
    assert (d.action, d.reason) == ("update", "warm start: n_estimators 10 -> 20")


@pytest.mark.parametrize("scalars, params", [
    ({"n_estimators": 5}, {"n_estimators": "n5"}),                     # shrank
    ({"n_estimators": 20, "warm_start": False}, {"n_estimators": "n20", "warm_start": "f"}),
    ({"n_estimators": 20, "lr": 0.2}, {"n_estimators": "n20", "lr": "b"}),  # not only growth
    ({"lr": 0.2}, {"lr": "b"}),                                          # not a growth param
])
def test_other_hyperparameter_changes_fit_from_scratch(scalars, params):
    new = changed(params={**BASE.params, **params}, scalars={**BASE.scalars, **scalars})
    d = decide(trained(), new)
    assert d.action == "fit" and d.reason.startswith("hyperparameters changed: ")


def test_no_warm_start_means_no_update():
    cold = changed(scalars={**BASE.scalars, "warm_start": False})
    grown = dataclasses.replace(cold, params={**BASE.params, "n_estimators": "n20"},
                                scalars={**cold.scalars, "n_estimators": 20})
    assert not can_update(cold, grown, ["n_estimators"])
    assert decide(trained(cold), grown).action == "fit"


def test_upstream_and_data_changes_take_precedence_over_warm_update():
    grown = changed(params={**BASE.params, "n_estimators": "n20"},
                    scalars={**BASE.scalars, "n_estimators": 20}, data={"s1": "d9"})
    assert decide(trained(), grown).action == "fit"


def test_changed_params_sees_added_and_removed_keys():
    assert changed_params(BASE, changed(params={"lr": "a", "new": "x"})) == ["n_estimators", "new"]


def test_with_upstream_replaces_only_counters():
    rec = BASE.with_upstream({"u1": 5})
    assert rec.upstream == {"u1": 5} and rec.data == BASE.data


def test_changed_training_graph_fits_and_breaks_input_reuse():
    from phalanx.network._retrain_rules import same_inputs

    other = changed(structure="g2")
    assert decide(trained(), other).reason == "its training graph changed"
    assert same_inputs(BASE, BASE) and not same_inputs(BASE, other)
    assert not same_inputs(None, BASE) and not same_inputs(BASE, changed(rows="r"))
