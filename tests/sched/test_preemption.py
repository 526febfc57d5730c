"""sched.preemption: the seeded reclaim process and its trace, shared by simulator and runtime."""

import pytest

from digenrl.sched.preemption import Join, Notice, SpotSpec, draw, engine_events, read_trace, write_trace

SPEC = SpotSpec(price=1.0, interruptions_per_hour=6.0, notice_s=30.0, replace_s=90.0)
WORKERS = [f"rollout-{i}" for i in range(4)]


def test_draw_is_a_function_of_the_seed_and_each_line_keeps_its_draws():
    a = draw(SPEC, WORKERS, horizon_s=4 * 3600, seed=7)
    assert a == draw(SPEC, WORKERS, horizon_s=4 * 3600, seed=7)
    assert a != draw(SPEC, WORKERS, horizon_s=4 * 3600, seed=8)
    grown = draw(SPEC, WORKERS + ["rollout-4"], horizon_s=4 * 3600, seed=7)
    assert [e for e in grown if not e.worker.startswith("rollout-4")] == a


def test_each_notice_is_followed_by_its_replacement_which_is_reclaimed_in_turn():
    events = draw(SPEC, WORKERS, horizon_s=10 * 3600, seed=1)
    assert [e.at_s for e in events] == sorted(e.at_s for e in events)
    for line in WORKERS:
        mine = [e for e in events if e.worker.split("+")[0] == line]
        alive = line
        for e in mine:  # notice, join, notice, join, ... along one line
            if isinstance(e, Notice):
                assert e.worker == alive and e.notice_s == 30.0
                last_notice = e
            else:
                assert e.replaces == alive and e.at_s == pytest.approx(last_notice.at_s + 90.0)
                alive = e.worker
    # 6 per hour per line over 10 h and 4 lines: about 240 notices (Poisson, loose bounds)
    notices = sum(isinstance(e, Notice) for e in events)
    assert 150 < notices < 300


def test_no_replacement_and_no_rate():
    once = draw(SpotSpec(1.0, 6.0, 30.0, replace_s=None), WORKERS, horizon_s=10 * 3600, seed=1)
    assert all(isinstance(e, Notice) for e in once) and len({e.worker for e in once}) == len(once) <= 4
    assert draw(SpotSpec(1.0, 0.0, 30.0, 90.0), WORKERS, horizon_s=10 * 3600, seed=1) == []


def test_trace_round_trips_and_maps_to_engine_events(tmp_path):
    events = draw(SPEC, WORKERS, horizon_s=3600, seed=3)
    path = tmp_path / "trace.jsonl"
    write_trace(path, events)
    assert read_trace(path) == events
    drains, deadlines, joins = engine_events(events)
    notices = [e for e in events if isinstance(e, Notice)]
    assert drains == [(n.at_s, n.worker) for n in notices]
    assert deadlines == [(n.at_s + 30.0, n.worker) for n in notices]
    assert joins == [(e.at_s, e.worker) for e in events if isinstance(e, Join)]


@pytest.mark.parametrize("line, message", [
    ('{"event": "leave", "at_s": 1}', "'event' must be"),
    ('{"event": "notice", "at_s": 1, "worker": "r"}', "missing ['notice_s']"),
    ('{"event": "join", "at_s": 1, "worker": "r", "replaces": "q", "x": 1}', "unknown ['x']"),
    ('{"event": "notice", "at_s": -1, "worker": "r", "notice_s": 3}', "finite numbers >= 0"),
    ("not json", "not JSON"),
])
def test_a_bad_trace_row_is_refused_with_its_line(tmp_path, line, message):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"event": "notice", "at_s": 0, "worker": "r", "notice_s": 3}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"trace.jsonl:2: .*{message}".replace("[", r"\[").replace("]", r"\]")):
        read_trace(path)


def test_a_bad_spec_is_refused_with_its_key():
    with pytest.raises(ValueError, match="spot.notice_s"):
        SpotSpec(price=1.0, interruptions_per_hour=1.0, notice_s=-1.0)
    with pytest.raises(ValueError, match="spot.replace_s"):
        SpotSpec(price=1.0, interruptions_per_hour=1.0, notice_s=1.0, replace_s=float("inf"))
