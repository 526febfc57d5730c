"""sim/tag_switch.SwitchLedger: which of a trainer's units cross a TAG switch and what each moves
(the simulator's charge, sim/durations.py, and what a run's tag/* counters are compared with)."""

from digenrl.sched import Generate, OptimizerStep, Train
from digenrl.sim.tag_switch import SwitchLedger


def test_round_trips_and_bytes_by_hand():
    # moved: 100 bytes one way in step 0 (no AdamW state yet), 300 after; a generation copy of 7
    led = SwitchLedger(lambda step: 100 if step == 0 else 300, reload=7)
    g = lambda step, mb, t=0: Generate(step, mb, (mb,), step, t, t + 1)  # noqa: E731
    tr = lambda step, mb: Train(step, mb, (mb,), (0,), step)  # noqa: E731
    seq = [("t0", g(0, 0)),        # enters the helper with nothing accumulated: nothing moves
           ("t0", g(0, 0, 1)),     # still in the helper: no switch
           ("t0", tr(0, 0)),       # leaves: round trip 1
           ("t0", tr(0, 1)),       # training: no switch
           ("t0", g(0, 2)),        # enters holding step 0's gradient: 100 out, 7 loaded
           ("t0", tr(0, 2)),       # leaves: 100 back, round trip 2
           ("t0", OptimizerStep(0, 1)),
           ("t0", g(1, 0)),        # after the optimizer step: nothing accumulated
           ("t0", tr(1, 0)),       # round trip 3
           ("t0", g(1, 1)),        # holding step 1's gradient: 300 out, 7 loaded
           ("t0", OptimizerStep(1, 2))]  # leaves at the optimizer step: 300 back, round trip 4
    edges = [led.unit(w, u) for w, u in seq]
    assert edges == [("in", 0, 0), None, ("out", 0, 0), None, ("in", 100, 7), ("out", 100, 0), None,
                     ("in", 0, 0), ("out", 0, 0), ("in", 300, 7), ("out_opt", 300, 0)]
    assert (led.switches, led.offloads, led.offload_bytes, led.reload_bytes) == (4, 2, 800, 14)


def test_trainers_are_tracked_apart_and_other_units_cross_nothing():
    led = SwitchLedger(50)
    assert led.unit("t0", Train(0, 0, (0,), (0,), 0)) is None
    assert led.unit("t1", Generate(0, 1, (1,), 0, 0, 2)) == ("in", 0, 0)  # t1 holds no gradient
    assert led.unit("t0", Generate(0, 2, (2,), 0, 0, 2)) == ("in", 50, 0)  # t0 does
    assert led.offload_bytes == 100 and led.switches == 0
