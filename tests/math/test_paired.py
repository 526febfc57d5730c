"""Paired statistics of `digenrl eval`, against numbers worked out by hand."""

import math

import pytest

from digenrl.math.paired import paired_stats


def test_paired_stats_by_hand():
    # d = [1, 0, 2]: mean 1; squared deviations 0 + 1 + 1 = 2, / (n - 1) = 1 -> sd 1;
    # se = 1 / sqrt(3); t = 1 / se = sqrt(3)
    s = paired_stats([1.0, 2.0, 3.0], [2.0, 2.0, 5.0])
    assert s["n"] == 3 and s["base_mean"] == 2.0 and s["trained_mean"] == 3.0 and s["mean_diff"] == 1.0
    assert s["se"] == pytest.approx(1 / math.sqrt(3)) and s["t"] == pytest.approx(math.sqrt(3))


def test_identical_scores_have_zero_difference_and_no_t():
    s = paired_stats([0.5, 0.7], [0.5, 0.7])
    assert s["mean_diff"] == 0.0 and s["se"] == 0.0 and s["t"] is None


def test_one_pair_has_no_standard_error():
    s = paired_stats([1.0], [3.0])
    assert s["mean_diff"] == 2.0 and s["se"] is None and s["t"] is None


def test_unequal_lengths_are_refused():
    with pytest.raises(ValueError, match="equal lengths"):
        paired_stats([1.0, 2.0], [1.0])
