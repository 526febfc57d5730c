"""SchedConfig: presets, switches, and errors that name the key and the allowed values."""

import pytest

from digenrl.sched import MODES, SchedConfig


def test_presets():
    c = SchedConfig(mode="digenrl")  # on-policy: TCSS is opt-in, as the RFC has it
    assert (c.gap, c.tsp, c.tag, c.bts, c.tcss, c.one_step_off) == (True, True, True, True, False, False)
    assert c.lag == 0
    assert SchedConfig(mode="digenrl", tcss=True).lag == 1
    assert not SchedConfig(mode="digenrl", tag=False).bts  # BTS decides TAG's bubbles: off without TAG
    c = SchedConfig(mode="gap")
    assert (c.gap, c.tsp, c.tag, c.tcss) == (True, False, False, False) and c.lag == 0
    assert SchedConfig(mode="one-step-off").lag == 1
    assert SchedConfig(mode="gap", tsp=True).tsp  # a switch overrides its preset


@pytest.mark.parametrize("kw, words", [
    (dict(mode="fast"), ["mode", "digenrl", "colocated"]),
    (dict(mode="local"), ["local", "scheduler"]),
    (dict(groups_per_step=0), ["groups_per_step", ">= 1"]),
    (dict(tsp_chunk=1.5), ["tsp_chunk"]),
    (dict(tag="yes"), ["tag", "True, False, None"]),
    (dict(mode="colocated", tag=True), ["tag", "colocated"]),
    (dict(mode="digenrl", tcss=True, one_step_off=True), ["tcss", "one_step_off"]),
    (dict(mode="gap+tsp", bts=True), ["bts", "tag=True"]),
    (dict(mode="digenrl", tcss=True, tcss_fraction=0.0), ["tcss_fraction", "(0, 1]"]),
    (dict(num_steps=4, trained_steps=(1, 4)), ["trained_steps", "num_steps=4"]),
])
def test_errors_name_key_and_allowed_values(kw, words):
    with pytest.raises(ValueError) as e:
        SchedConfig(**kw)
    for w in words:
        assert w in str(e.value)


def test_trained_steps_forms():
    assert SchedConfig(num_steps=5).trained(0) == (0, 1, 2, 3)  # all but the last
    assert SchedConfig(num_steps=5, trained_steps=[3, 1, 1]).trained(7) == (1, 3)
    c = SchedConfig(num_steps=5, trained_steps=lambda k: range(k, k + 2))  # sliding window
    assert c.trained(2) == (2, 3)
    with pytest.raises(ValueError, match=r"trained_steps\(4\)"):
        c.trained(4)


def test_all_modes_construct():
    for m in MODES:
        SchedConfig(mode=m)
