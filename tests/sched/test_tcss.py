"""TCSS is opt-in (the RFC: "an explicitly enabled bounded-staleness extension"): off, a step's
micro-batches all start on the current version; on, at most tcss_fraction of them (rounded up)
start on the previous one, each trajectory keeping its one version."""

from __future__ import annotations

import pytest

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.config.contract import contract

from .sched_helpers import done, run


def _stale_per_step(tr) -> dict:
    out: dict = {}
    for x in done(tr, "generate"):
        if x.unit.t_start == 0:
            out.setdefault(x.step, set())
            if x.version < x.step:
                out[x.step].add(x.unit.mb)
    return out


def test_off_by_default_strictly_on_policy():
    s, tr = run("digenrl", rl_steps=4)
    assert not s.cfg.tcss and all(not v for v in _stale_per_step(tr).values())
    assert all(x.unit.traj_version == x.step for x in done(tr, "train"))


@pytest.mark.parametrize("fraction, cap", [(1.0, 6), (0.5, 3), (0.2, 2)])
def test_fraction_caps_the_stale_micro_batches(fraction, cap):
    # 12 groups in micro-batches of 2: 6 per step; 0.2 of 6 rounds up to 2
    s, tr = run("digenrl", rl_steps=4, tcss=True, tcss_fraction=fraction)
    stale = _stale_per_step(tr)
    assert max(len(v) for v in stale.values()) <= cap
    assert any(stale.values())  # it did overlap
    lags = {x.step - x.unit.traj_version for x in done(tr, "train")}
    assert lags <= {0, 1}


def test_config_key():
    cfg = load_config(None, ["run.tcss_fraction=0.5"])
    sc = contract(cfg).sched
    assert sc.tcss and sc.tcss_fraction == 0.5 and sc.lag == 1
    assert not contract(load_config(None, [])).sched.tcss
    with pytest.raises(ConfigError, match="run.tcss_fraction"):
        load_config(None, ["run.tcss_fraction=1.5"])
    with pytest.raises(ConfigError, match="run.tcss_fraction"):
        load_config(None, ["run.mode=disagg-sync", "run.tcss_fraction=0.5"])


def test_the_cap_binds():
    # the uncapped run starts more than 2 micro-batches stale in some step, so the 0.2 cap (2) acts
    full = _stale_per_step(run("digenrl", rl_steps=4, tcss=True, tcss_fraction=1.0)[1])
    assert max(len(v) for v in full.values()) > 2
