"""Dense rank bookkeeping (pure)."""

import pytest

from phalanx.cluster._ranks import RankTable


def test_ranks_stay_stable_when_growing_and_redense_when_shrinking():
    table = RankTable()
    for slot in "abcd":
        table.append(slot)
    assert [table.rank_of(s) for s in "abcd"] == [0, 1, 2, 3]
    table.remove("b")
    assert [table.rank_of(s) for s in "acd"] == [0, 1, 2]


def test_replace_keeps_the_rank_of_a_restarted_engine():
    table = RankTable()
    table.append("a"); table.append("b")
    assert table.replace("b", "b2") == 1
    assert list(table) == ["a", "b2"]


def test_highest_lists_what_scaling_down_stops():
    table = RankTable()
    for slot in "abc":
        table.append(slot)
    assert table.highest(2) == ["c", "b"]
    assert table.highest(0) == []


def test_unknown_rank_is_a_clear_error():
    table = RankTable()
    table.append("a")
    with pytest.raises(IndexError, match="ranks are 0..0"):
        table.slot_at(3)
