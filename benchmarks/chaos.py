"""Chaos: many RL steps of emulated compute while rollout and reward workers are SIGKILLed,
or (--preempt) while spot rollout workers get reclaim notices, some honoured, some cut short.

    python benchmarks/chaos.py [--steps 1000] [--ms 10] [--kill-every 30] [--kill-at random|dispatch|mixed]
                               [--stall 60] [--json chaos.json] [--plot rss.png] [--trace trace.jsonl]
    python benchmarks/chaos.py --preempt [--notice-every 2] [--notice-s 1] [--cut-frac 0.5] [--replace-s 1]

The real driver loop (`EmulatedLoop`, the scheduler, Ray actors and their failures) with a
tiny constant `duration_fn` (`--ms` milliseconds per unit), so a step takes well under a second.
A killer thread SIGKILLs a random live rollout or reward worker about every `--kill-every`
seconds (uniform in [0.5, 1.5] x that): `random` kills at whatever point the worker is at
(mid-unit or idle), `dispatch` just before the next unit is sent to it (the loop's
on_dispatch hook), `mixed` alternates. Trainers are never killed: emulated compute has no
weights, so a trainer's death (the --resume path) means nothing here.

--preempt: no SIGKILLs. The rollout workers are spot workers (runtime/preempt.py): a seeded
reclaim process (sched.preemption.draw, one line per worker, a notice about every
--notice-every seconds across the pool, the replacement joining --replace-s later, itself
reclaimable) is sent on the run's clock. A --cut-frac share of the notices (drawn with the
seed) has no time left (deadline 0: the worker is killed at once, its unit regenerated); the
others give --notice-s seconds, many units long, so the drain completes (the unit finishes or
hands its trajectory over at the next step boundary). Printed: units, notices, drains
honoured, kills, and the samples lost and trained twice (both must be 0), counted per
(step, micro-batch, sample, trained step) from the trace.

Checks, printed and written to the JSON report (exit status 1 when one fails):
    no deadlock     the loop's watchdog (EventLoop stall_s): no unit finished for --stall s
                    fails with the scheduler's describe()
    exactly-once    every Train unit (step, micro-batch, trained steps, rows) completed once
                    (from the trace, which the loop streams to --trace as the real driver does
                    (io/trace.py TraceLog), read back after the run; a lost unit's span is
                    marked and not counted)
    flat memory     the driver's RSS (/proc/self/statm), sampled every --rss-every s: the
                    mean of the run's last quarter within --flat-pct % of its second
                    quarter's (the first quarter is warm-up: Ray's and the actors' start)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Optional

import ray

from digenrl.io.trace import TraceLog, iter_spans
from digenrl.runtime.emulated import PREEMPT_POLL_S, EmulatedBackend, EmulatedLoop
from digenrl.runtime.preempt import Preemption, TraceNotices
from digenrl.sched import Scheduler, SchedConfig, Worker, kind
from digenrl.sched.preemption import Notice, SpotSpec, draw
from digenrl.sched.units import partition, split_rows

# cost of each unit kind in units of --ms (Generate: per denoising step); time_scale 1
COST = {"generate": 1.0, "reward": 1.0, "train": 1.5, "optimizer": 1.0, "sync": 1.0}


class Durations:
    """duration_fn(worker, unit) -> seconds: COST[kind] x `ms` milliseconds (picklable)."""

    def __init__(self, ms: float):
        self.s = ms / 1e3

    def __call__(self, worker: Worker, unit) -> float:
        k = kind(unit)
        return self.s * COST[k] * (unit.t_end - unit.t_start if k == "generate" else 1)


class ChaosBackend(EmulatedBackend):
    """EmulatedBackend that knows each killable (rollout / reward) worker's process."""

    def __init__(self, workers, duration_fn):
        super().__init__(workers, duration_fn, time_scale=1.0)
        self.lock = threading.Lock()
        roles = {w.id: w.role for w in workers}
        pids = ray.get([h.pid.remote() for h in self.handles.values()])
        self.victims = {w: p for w, p in zip(self.handles, pids) if roles[w] in ("rollout", "reward")}

    def replace(self, worker: Worker) -> Worker:
        new = super().replace(worker)
        pid = ray.get(self.handles[new.id].pid.remote())  # also: the replacement is up
        with self.lock:
            self.victims.pop(worker.id, None)
            self.victims[new.id] = pid
        return new

    def kill_one(self, rng: random.Random, wid: Optional[str] = None) -> Optional[str]:
        """SIGKILL worker `wid` (else a random live victim); it stops being a victim."""
        with self.lock:
            if wid is None:
                if not self.victims:
                    return None
                wid = rng.choice(sorted(self.victims))
            pid = self.victims.pop(wid)
        os.kill(pid, signal.SIGKILL)
        return wid


def spot_events(args, workers: list[str]) -> list:
    """The seeded reclaims of `workers` (sched.preemption.draw) over the longest the run could
    take, a --cut-frac share of the notices with no time left."""
    rate = 3600.0 / (args.notice_every * len(workers))  # per worker and hour
    spec = SpotSpec(price=0.0, interruptions_per_hour=rate, notice_s=args.notice_s, replace_s=args.replace_s)
    events = draw(spec, workers, horizon_s=args.steps * 10.0, seed=args.seed)
    cut = random.Random(f"{args.seed}/cut")
    return [Notice(e.at_s, e.worker, 0.0) if isinstance(e, Notice) and cut.random() < args.cut_frac else e
            for e in events]


def sample_slots(unit, spg: int):
    """(step, micro-batch, sample row, trained step) of each sample a Train unit trains."""
    lo, hi = unit.samples if unit.samples is not None else (0, len(unit.groups) * spg)
    return [(unit.step, unit.mb, row, t) for row in range(lo, hi) for t in unit.t_steps]


def expected_samples(c: SchedConfig) -> Counter:
    mbs = partition(c.groups_per_step, c.micro_batch_groups)
    return Counter((k, m, row, t) for k in range(c.rl_steps) for m, groups in enumerate(mbs)
                   for row in range(len(groups) * c.samples_per_group) for t in c.trained(k))


def rss_mb() -> float:
    """This process's resident set (MiB), from /proc/self/statm (pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def expected_trains(c: SchedConfig) -> Counter:
    """(step, mb, trained steps, rows) of every Train unit of the run, once each."""
    mbs = partition(c.groups_per_step, c.micro_batch_groups)
    out = Counter()
    for k in range(c.rl_steps):
        ts = c.trained(k)
        chunks = [ts[i:i + c.tsp_chunk] for i in range(0, len(ts), c.tsp_chunk)] if c.tsp else [ts]
        for m, groups in enumerate(mbs):
            for rows in split_rows(len(groups) * c.samples_per_group, c.train_shard):
                out.update((k, m, chunk, rows) for chunk in chunks)
    return out


def memory_summary(samples: list[tuple[float, float, int]], flat_pct: float) -> dict:
    """first / median / last / max RSS, and the flat check (last quarter vs second quarter)."""
    mb = [s[1] for s in samples]
    t_end = samples[-1][0]
    q = lambda lo, hi: [m for t, m, _ in samples if lo * t_end <= t < hi * t_end] or [mb[-1]]  # noqa: E731
    q2, q4 = statistics.mean(q(0.25, 0.5)), statistics.mean(q(0.75, 1.01))
    growth = 100.0 * (q4 - q2) / q2
    # the slope between the two quarters per RL step (the trace the driver keeps grows per unit)
    steps = lambda lo, hi: [k for t, _, k in samples if lo * t_end <= t < hi * t_end] or [samples[-1][2]]  # noqa: E731
    d_steps = statistics.mean(steps(0.75, 1.01)) - statistics.mean(steps(0.25, 0.5))
    return {"first": mb[0], "median": statistics.median(mb), "last": mb[-1], "max": max(mb),
            "q2_mean": q2, "q4_mean": q4, "growth_pct": growth, "flat_pct": flat_pct,
            "kib_per_step": 1024 * (q4 - q2) / d_steps if d_steps > 0 else None,
            "flat": abs(growth) <= flat_pct, "n_samples": len(mb)}


def run(args, trace_path: str) -> dict:
    c = SchedConfig(mode=args.mode, rl_steps=args.steps, groups_per_step=4, micro_batch_groups=1,
                    num_steps=4, rollout_segment=2, tsp_chunk=2)
    workers = ([Worker(f"rollout-{i}" if args.preempt else f"r{i}", "rollout") for i in range(args.rollout)]
               + [Worker(f"t{i}", "trainer") for i in range(args.trainer)]
               + [Worker(f"w{i}", "reward") for i in range(args.reward)])
    sched = Scheduler(c, workers)
    backend = ChaosBackend(workers, Durations(args.ms))
    rng = random.Random(args.seed)
    kills: list[dict] = []
    stop = threading.Event()
    due = threading.Event()  # a dispatch-time kill is due
    t0 = time.time()

    def killer():
        n = 0
        while not stop.wait(rng.uniform(0.5, 1.5) * args.kill_every):
            at = args.kill_at if args.kill_at != "mixed" else ("random", "dispatch")[n % 2]
            n += 1
            if at == "dispatch":
                due.set()
                continue
            wid = backend.kill_one(rng)
            if wid is not None:
                kills.append({"t": time.time() - t0, "worker": wid, "at": "random", "step": sched.version})

    def at_dispatch(wid, unit):
        if due.is_set() and wid in backend.victims:
            due.clear()
            backend.kill_one(rng, wid)
            kills.append({"t": time.time() - t0, "worker": wid, "at": "dispatch", "unit": kind(unit),
                          "step": sched.version})
            time.sleep(0.05)  # dead before the call is sent: the unit is lost for sure

    samples: list[tuple[float, float, int]] = []

    def sampler():
        while True:
            samples.append((time.time() - t0, rss_mb(), sched.version))
            if stop.wait(args.rss_every):
                return

    spot, hooks = None, dict(on_dispatch=at_dispatch)
    if args.preempt:  # reclaim notices instead of SIGKILLs
        spot = Preemption([TraceNotices(spot_events(args, [w.id for w in workers if w.role == "rollout"]))],
                          clock=lambda loop: loop.now(), kill=backend.kill, add=backend.add)
        hooks = dict(poll=spot.poll, poll_s=PREEMPT_POLL_S)
    threads = [threading.Thread(target=f, daemon=True) for f in ((sampler,) if args.preempt else (killer, sampler))]
    for th in threads:
        th.start()
    error = None
    log = TraceLog(trace_path)
    try:
        loop = EmulatedLoop(sched, backend, stall_s=args.stall, trace=log, **hooks)
        loop.run()
        if spot is not None:
            spot.finish(loop)
    except RuntimeError as e:  # the watchdog (or the scheduler) gave up
        error = str(e)
    finally:
        stop.set()
        for th in threads:
            th.join()
        backend.close()
        log.close()
    wall = time.time() - t0
    report = {"mode": args.mode, "unit_ms": args.ms, "steps_planned": args.steps, "steps_done": sched.version,
              "wall_s": wall, "steps_per_s": sched.version / wall, "kill_every_s": args.kill_every,
              "kill_at": args.kill_at, "kills": len(kills), "kill_log": kills, "stall_s": args.stall,
              "deadlock": error, "scheduler": dict(sched.stats),
              "pools": {"rollout": args.rollout, "trainer": args.trainer, "reward": args.reward}}
    if spot is not None:
        report.update(spot=dict(spot.stats), spot_log=spot.log, kills=spot.stats["killed"])
    if error is None:  # after the RSS samples: what is read back here is not the run's memory
        trains, slots, units, lost = Counter(), Counter(), 0, 0
        for s in iter_spans(trace_path):
            units += 1
            if s.extra and s.extra.get("lost"):
                lost += 1
            elif s.kind == "train":
                trains[(s.unit.step, s.unit.mb, s.unit.t_steps, s.unit.samples)] += 1
                slots.update(sample_slots(s.unit, c.samples_per_group))
        want, want_samples = expected_trains(c), expected_samples(c)
        report.update(
            train_units=sum(trains.values()), units=units, lost_units=lost,
            replacements=len(log.workers) - len(workers),
            trained_twice=sum(1 for k, n in trains.items() if n > 1),
            never_trained=sum(1 for k in want if k not in trains),
            samples_lost=sum((want_samples - slots).values()),
            samples_duplicated=sum(n - 1 for n in slots.values() if n > 1),
            exactly_once=trains == want and slots == want_samples)
    report["rss_mb"] = memory_summary(samples, args.flat_pct)
    report["rss_samples"] = [[round(t, 2), round(m, 1), s] for t, m, s in samples]
    report["ok"] = (error is None and report.get("exactly_once", False) and report["rss_mb"]["flat"]
                    and report["steps_done"] == args.steps)
    return report


def plot_rss(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, mb, _ = zip(*report["rss_samples"])
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(t, mb, lw=1)
    for k in report["kill_log"]:
        ax.axvline(k["t"], color="red", lw=0.5, alpha=0.5)
    ax.set(xlabel="wall s (red: a worker SIGKILLed)", ylabel="driver RSS (MiB)",
           title=f"{report['steps_done']} steps, {report['kills']} kills")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--mode", default="digenrl")
    p.add_argument("--rollout", type=int, default=4)
    p.add_argument("--trainer", type=int, default=2)
    p.add_argument("--reward", type=int, default=2)
    p.add_argument("--ms", type=float, default=10.0,
                   help="milliseconds of a unit (x COST of its kind): 10 gives ~0.2 s RL steps")
    p.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills, on average")
    p.add_argument("--kill-at", choices=("random", "dispatch", "mixed"), default="mixed")
    p.add_argument("--stall", type=float, default=60.0, help="watchdog: seconds without a completion")
    p.add_argument("--rss-every", type=float, default=0.5)
    p.add_argument("--flat-pct", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preempt", action="store_true",
                   help="spot rollout workers get reclaim notices (some honoured, some cut short) instead of SIGKILLs")
    p.add_argument("--notice-every", type=float, default=2.0, help="--preempt: seconds between notices across the pool, on average")
    p.add_argument("--notice-s", type=float, default=1.0, help="--preempt: the deadline of an honoured notice (s)")
    p.add_argument("--cut-frac", type=float, default=0.5, help="--preempt: share of notices with no time left (killed)")
    p.add_argument("--replace-s", type=float, default=1.0, help="--preempt: seconds from a notice to its replacement")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--plot", help="write the RSS plot (PNG) here")
    p.add_argument("--trace", help="keep the run's trace.jsonl here (default: a temporary file)")
    args = p.parse_args(argv)

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            report = run(args, args.trace or os.path.join(tmp, "trace.jsonl"))
    finally:
        ray.shutdown()
    m = report["rss_mb"]
    if args.preempt:
        sp = report["spot"]
        print(f"chaos --preempt: {report['steps_done']}/{args.steps} steps of {args.mode} in {report['wall_s']:.1f}s, "
              f"{report.get('units', '?')} units; {sp['notices']} notices ({sp['ignored']} for workers already "
              f"gone), {sp['honoured']} drains honoured, {sp['killed']} killed at the deadline "
              f"({sp['refused']} drains refused: the last rollout worker), {sp['joins']} replacements joined; "
              f"{report.get('lost_units', '?')} units lost and regenerated")
        print(f"  samples lost: {report.get('samples_lost', '?')}, samples trained twice: "
              f"{report.get('samples_duplicated', '?')}")
    else:
        print(f"chaos: {report['steps_done']}/{args.steps} steps of {args.mode} in {report['wall_s']:.1f}s "
              f"({report['steps_per_s']:.1f} steps/s), {report['kills']} workers SIGKILLed "
              f"(~every {args.kill_every:g}s, at {args.kill_at}), {report.get('lost_units', '?')} units lost, "
              f"{report.get('replacements', '?')} replacements")
    print(f"  deadlock: {report['deadlock'] or 'none'}; exactly-once: {report.get('exactly_once')} "
          f"({report.get('train_units', '?')} Train units, {report.get('trained_twice', '?')} twice, "
          f"{report.get('never_trained', '?')} never)")
    print(f"  driver RSS MiB: first {m['first']:.1f}, median {m['median']:.1f}, last {m['last']:.1f}, "
          f"max {m['max']:.1f}; last quarter vs second {m['growth_pct']:+.1f}% "
          f"({m['kib_per_step'] or 0:.1f} KiB per step) "
          f"({'flat' if m['flat'] else 'NOT flat'}, bound {m['flat_pct']:g}%)")
    print(f"  {'OK' if report['ok'] else 'FAILED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot and report["rss_samples"]:
        plot_rss(report, args.plot)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
