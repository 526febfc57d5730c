"""math.payload.expected_kept is the mean of kept_steps over every per-sample draw of trained steps
(sampling.window_draw=sample), finished rows and segments stopped at each step alike."""

from itertools import combinations

import pytest

from digenrl.math.payload import expected_kept, kept_steps


@pytest.mark.parametrize("num_steps", [2, 3, 5, 8])
def test_expected_kept_is_the_mean_over_every_draw(num_steps):
    levels = num_steps - 1  # the SDE steps: every step but the last
    for k in range(1, levels + 1):
        draws = list(combinations(range(levels), k))
        for t_done in (None, *range(1, num_steps)):
            mean = sum(len(kept_steps(d, num_steps, "transitions", t_done)) for d in draws) / len(draws)
            assert expected_kept(k, levels, num_steps, "transitions", t_done) == pytest.approx(mean, abs=1e-12)


def test_one_trained_step_ships_two_latents_and_the_clean_sample_one():
    assert expected_kept(1, 9, 10, "transitions") == pytest.approx(2.0)
    assert expected_kept(3, 9, 10, "final") == 1.0
    with pytest.raises(ValueError, match="draw 4 trained steps of 3 levels"):
        expected_kept(4, 3, 4, "transitions")
