"""RayDriver: the Flow-GRPO run of `digenrl.train.trainer.Trainer`, on Ray pools, in any mode.

    driver (this process)                      Ray actors (digenrl.runtime.workers)
    ---------------------                      ------------------------------------
    contract(cfg) -> SchedConfig + pools       rollout-i  generate / reward / load_weights
    [runtime.plan: profile, plan the knobs]    trainer-j  train / optimizer_step (all-reduce)
    Scheduler.assign() --unit--> dispatch -->             [/ TAG generate / save]
         ^   (RealBackend, runtime/backend.py) reward-k   reward
         |   ray.wait(result refs)             eval-0     held-out evaluation (EvalWorker)
         +-- complete / worker_lost <-------
    rewards -> advantages (per micro-batch)    Trajectories and weights move actor -> actor
    metrics.jsonl, trace.json, gantt.png       as ObjectRefs; the driver only sees the small
                                               typed results (runtime/results.py)

This module owns the run's lifecycle (planning, resume, the initial weights, the event loop,
emulated compute, shutdown); runtime/actors.py owns the actors, runtime/backend.py what each
unit means.

Outputs mirror the single-device trainer (metrics.jsonl with the same required keys, eval
on held-out prompts by the evaluation actor, checkpoints by trainer 0 in the same format, so
`--resume` works across local and Ray runs, final/policy.safetensors, reward plot,
summary.json) plus `trace.jsonl` (the trace, a line per span, written as the run goes: the
driver keeps only the current step's window), and from it at the end `trace.json` (Perfetto)
and `gantt.png` (io/trace.py: `build_outputs`). Per-step metrics add `mode`,
`staleness_max`, `bubble_ratio_rollout`, `bubble_ratio_trainer`, `weight_sync_s`,
`weight_sync_bytes`.

The run directory must be on storage every node sees (trainer 0 writes checkpoints and
eval samples there; the driver writes the rest).

No wait here is open-ended: placement runtime.placement_timeout_s, start-up and the final
weights runtime.start_timeout_s, the event loop and the end-of-run records
runtime.stall_timeout_s; a passed deadline raises WaitTimeout (runtime/waits.py) naming what
it waited for (docs/guides/running.md, "Waits and their deadlines").
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Callable, Optional

import ray

from digenrl.config.schema import Config, dotted_get
from digenrl.config.contract import RunContract, contract
from digenrl.io.recorder import RunRecorder
from digenrl.runtime.actors import Actors
from digenrl.runtime.autoscale import Autoscaler
from digenrl.runtime.backend import RealBackend, StepPlans
from digenrl.runtime.cluster import actor_options, await_room, connect
from digenrl.runtime.elastic import Elastic
from digenrl.runtime.loop import EventLoop
from digenrl.runtime.cloud_notices import Watchers
from digenrl.runtime.preempt import Preemption, notice_dir, polls, spot_sources
from digenrl.runtime.waits import within
from digenrl.sched import Scheduler, Unit
from digenrl.io.trace import Trace, TraceLog, build_outputs, iter_spans, plot_gantt, read_trace, write_chrome_trace


class RayDriver:
    """`RayDriver(cfg).train(resume=False) -> summary`, for every run.mode except local.

    evaluate=False skips held-out evaluation (benchmarks); finish=False the checkpoints, the
    final weights and the summary (runtime.plan's probe runs). `on_dispatch(trainer, worker_id,
    unit)` is called before each unit is sent (tests inject faults with it). `notices`: the
    spot notice sources of a preemptible rollout pool (runtime/preempt.py), instead of the
    config's (tests send notices on events of the run).
    """

    def __init__(self, cfg: Config, *, progress: bool = True, evaluate: bool = True,
                 on_dispatch: Optional[Callable[["RayDriver", str, Unit], None]] = None,
                 notices: Optional[list] = None, finish: bool = True):
        contract(cfg)  # refuses run.mode=local (the scheduler's one check) before any file is written
        self.cfg, self.progress, self.do_eval = cfg, progress, evaluate
        self.finish = finish  # False (runtime.plan's probe): no final weights or summary, train() -> {}
        self.on_dispatch = on_dispatch
        self.run_dir = Path(cfg.run.run_dir)
        self.actors: Optional[Actors] = None  # the run's Ray actors, from the start of train()
        self.trace_log: Optional[Path] = None  # trace.jsonl, once the event loop has started
        self._trace: Optional[Trace] = None  # `trace`, read back from trace_log (or emulated: kept)
        self.base = 0  # RL step the run starts from (resume)
        self.here = None  # digenrl.sim.here.HerePlan when runtime.plan planned this run
        self.elastic = None  # runtime/elastic.Elastic while the event loop runs (digenrl scale)
        self.notices = notices  # spot notice sources (tests); None = the config's (preempt.spot_sources)
        self.preemption: Optional[Preemption] = None  # runtime.rollout.preemptible: the driver's side
        self.spot: Optional[dict] = None  # its counts after the run (notices, honoured, killed, ...)
        self.watchers: Optional[Watchers] = None  # runtime.rollout.watch: the nodes' metadata watchers

    @property
    def trace(self) -> Optional[Trace]:
        """The run's whole trace, read back from trace.jsonl when first asked for (after a run
        that stopped: every span that finished); None before the event loop started. The run
        itself holds only a step's window of it (io/trace.py TraceLog): the whole grows with
        every unit."""
        if self._trace is None and self.trace_log is not None:
            self._trace = read_trace(self.trace_log)
        return self._trace

    @property
    def trained(self) -> list[tuple[int, int, int, int]]:
        """(step, group, sample, t) as the trainers reported them, from trace.jsonl's Train
        spans (after a run that stopped too: tests check exactly-once after a fault)."""
        if self.trace_log is None:
            return []
        return [tuple(c) for s in iter_spans(self.trace_log) if s.kind == "train" and s.extra
                for c in s.extra.get("trained", ())]

    @property
    def pids(self) -> dict[str, int]:
        """Worker id -> its (rank 0) process (tests kill them)."""
        return self.actors.pids

    @property
    def rank_pids(self) -> dict[str, list[int]]:
        """Worker id -> the process of each rank of its gang."""
        return self.actors.rank_pids

    def contract(self, plans: "StepPlans") -> RunContract:
        """The scheduler config and pools of this run, from RL step `base` on (digenrl.config.contract)."""
        return contract(self.cfg, start_step=self.base, trained=lambda step: plans(step).trained_steps)

    # -- the run -----------------------------------------------------------------------------
    def train(self, *, resume: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        if cfg.runtime.compute == "emulated":
            return self._train_emulated()
        # files, cadence, bar, summary
        self.recorder = RunRecorder(cfg, progress=self.progress, checkpoints=self.finish)
        latest = self.recorder.resume_checkpoint() if resume else None
        pools = contract(cfg).pools
        started = connect(cfg.runtime.address, [(p.resources, p.workers * p.resources.gang) for p in pools])
        if cfg.runtime.rollout.preemptible:  # spot workers register on their nodes as they start: this run's
            from digenrl.runtime.cloud_notices import clear

            clear(notice_dir(cfg))
        try:
            if cfg.wants_plan():  # a resumed run keeps the plan its checkpoint was made with
                cfg = self.cfg = self._plan_here() if latest is None else _planned(cfg, latest)
                self.recorder = RunRecorder(cfg, progress=self.progress)  # config.json: the planned run
            self.actors = Actors(cfg, self.do_eval)
            self.actors.start(contract(cfg).pools)
            wall0 = self._load(latest) if latest is not None else 0.0
            weights0 = self._sync_initial()
            rec = self.recorder
            rec.open(self.base if latest is not None else None)
            try:
                first = self.actors.evaluate(self.base) if rec.eval_due(self.base) else None  # overlaps step 1
                if self.base < cfg.train.steps:
                    self._run(weights0, wall0, first)
                else:
                    if first is not None:
                        rec.log({"step": self.base, **self._get("trainer 0's evaluation", first, "stall")})
                    self.stats, self.wall_s = {}, wall0
            finally:
                rec.close()
            return self._finish() if self.finish else {}
        finally:
            if self.actors is not None:
                self.actors.shutdown()
            if started:
                ray.shutdown()

    def _load(self, latest: Path) -> float:
        """Every trainer rank resumes from checkpoint `latest`; returns the run's wall seconds so far."""
        trainers = self.actors.train_ids
        steps = within(self.cfg.runtime, "start", {w: self.actors.gang(w).load(str(latest)) for w in trainers},
                       f"trainers loading {latest}")
        self.base = steps[trainers[0]][0]
        return json.loads((latest / "state.json").read_text()).get("wall_s", 0.0)

    def _sync_initial(self):
        """Version `base` everywhere: trainer 0's published weights (this also fixes LoRA's random
        init) go to every other policy worker; returns the ref of the published payload."""
        cfg, actors = self.cfg, self.actors
        first_trainer = actors.train_ids[0]  # its weights are the ones published
        weights0 = actors.trainer0.publish()
        sharded = cfg.runtime.trainer.shard == "fsdp"  # trainer ranks start equal (broadcast, load)
        relay = cfg.runtime.weight_sync == "nccl"  # rollout workers: from the relay, not the store
        # a resumed run's trainers all loaded the checkpoint (`_load`): they keep its weights,
        # which need not be the published ones (DiffusionNFT publishes its old policy)
        loading = [w for w in actors.workers
                   if w.role not in ("reward", "rollout" if relay else "") and w.id != first_trainer
                   and not ((sharded or self.base > 0) and w.id in actors.train_ids)]
        within(cfg.runtime, "start", {w.id: actors.gang(w.id).load_weights(None, self.base, weights0) for w in loading},
               f"loading the initial weights (version {self.base})")
        if relay:
            # the relay holds version `base` once the publish is done (its result is small then)
            within(cfg.runtime, "start", {f"{first_trainer} (publish)": weights0}, "publishing to the relay")
            rollout = [w.id for w in actors.workers if w.role == "rollout"]
            if rollout:  # the chain forms, then the relay sends version `base` down it
                actors.form_relay_chain(rollout)
            for wid in rollout:
                self._get(f"{wid} loading version {self.base} from the relay", actors.pull(wid, None, self.base),
                          "start")
        return weights0

    def _run(self, weights0, wall0: float, first: Optional[ray.ObjectRef]) -> None:
        """The scheduler's units on the actors until the last RL step (runtime/loop.py)."""
        plans = StepPlans(self.cfg)
        backend = RealBackend(self.actors, self.recorder, plans, self.base, weights0, wall0)
        if first is not None:
            backend.records.append(({"step": self.base}, first))
        sched = Scheduler(self.contract(plans).sched, self.actors.workers)
        elastic = self.elastic = Elastic(self.actors, self.run_dir)  # `digenrl scale` requests
        pool = self.cfg.runtime.rollout
        if pool.preemptible:  # spot workers: notices drain them, deadlines kill them (runtime/preempt.py)
            self.preemption = Preemption(
                self.notices if self.notices is not None else spot_sources(self.cfg),
                clock=lambda loop: loop.now(), kill=backend.kill,
                add=lambda join, loop: elastic.grow(f"spot replacement for {join.replaces} ({join.worker})"))
        # runtime.rollout.watch: a watcher on each spot node polls the cloud's metadata service
        watchers = self.watchers = Watchers.from_config(self.cfg)
        autoscaler = None
        if pool.max_workers:  # ask Ray's autoscaler for nodes (runtime/autoscale.py)
            autoscaler = Autoscaler(self.cfg, lambda loop: elastic.rollout_count(loop.sched), elastic.grow)
        # a resumed run starts a new trace.jsonl: its clock starts again at 0
        self.trace_log, self._trace = self.run_dir / "trace.jsonl", None
        with TraceLog(self.trace_log) as log:
            loop = EventLoop(sched, backend, on_dispatch=self._hook,
                             poll=polls(elastic.poll, watchers and watchers.poll,
                                        self.preemption and self.preemption.poll, autoscaler and autoscaler.poll),
                             on_leave=elastic.left, trace=log, stall_s=self.cfg.runtime.stall_timeout_s)
            elastic.start(loop)
            if autoscaler is not None:
                autoscaler.start()
            try:
                loop.run()
            finally:
                if watchers is not None:
                    watchers.close()
                if autoscaler is not None:
                    autoscaler.close()
                if self.preemption is not None:
                    self.spot = self.preemption.finish(loop)
                    _write_jsonl(self.run_dir / "spot.jsonl", self.preemption.log)
                elastic.close()
                self.elastic = None
                self._trace = None  # a read during the run (a hook) cached only part of the file
        backend.flush(block=True)
        self.stats = dict(sched.stats)
        self.wall_s = backend.wall_s

    def _plan_here(self) -> Config:
        """runtime.plan: time each unit kind on a trainer-pool worker (digenrl.profile), measure
        what the runtime adds around the units on a short run of the config as given
        (runtime.plan_probe_steps, `_probe`), then pick the knobs the config leaves open on the
        simulator (digenrl.sim.here)."""
        from digenrl.config.schema import with_overrides
        from digenrl.sim.here import plan_here, probe_steps

        cfg, rt = self.cfg, self.cfg.runtime
        opts = {k: v for k, v in actor_options(rt.trainer).items() if k not in ("max_restarts", "max_task_retries")}
        await_room(rt.trainer, 1, "trainer (runtime.plan's profile)", rt.placement_timeout_s)
        lines, cores = self._get("runtime.plan's profile of the units (one trainer-pool slot)",
                                 ray.remote(_profile_here).options(**opts).remote(cfg), "start")
        # GPU workers share no cores; CPU workers share the node's
        gpu = all(p.resources.num_gpus > 0 for p in contract(cfg).pools if p.workers and p.role != "reward")
        shared = 10**6 if gpu else cores
        n = probe_steps(rt.plan_probe_steps, gpu)
        probes = itertools.count(1)
        probe = (lambda c: self._probe(c, next(probes), n, lines, shared)) if n else None
        self.here = plan_here(cfg, lines, cores=shared, given=cfg.given, probe=probe,
                              eval_samples=_eval_samples(cfg) if self.do_eval else 0)
        if self.here.runtime is not None:  # the chosen plan's probe, as here_vs_run.py re-prices it
            lines = [*lines, self.here.runtime.line()]
        self.run_dir.mkdir(parents=True, exist_ok=True)  # what the plan priced, for benchmarks/here_vs_run.py
        _write_jsonl(self.run_dir / "profile.jsonl", [dict(r, cores=cores) for r in lines])
        if self.progress:
            print(self.here.describe(), flush=True)
        return with_overrides(cfg, self.here.overrides)

    def _probe(self, candidate: Config, i: int, n: int, lines: list[dict], cores: int):
        """`n` (runtime.plan_probe_steps) RL steps of a candidate configuration, on its own actors,
        without evaluation, checkpoints, loggers, final weights, spot notices or autoscaling, in
        <run_dir>/probes/<i>; what the runtime added to its units over their profiled charges
        (digenrl.sim.here.RuntimeCosts)."""
        from digenrl.config.runtime import SPOT_KEYS, PoolConfig
        from digenrl.config.schema import with_overrides
        from digenrl.sim.here import KNOBS, MeasuredCosts, MeasuredDurations, RuntimeCosts, slowdown

        spot = {f"runtime.rollout.{k}": getattr(PoolConfig, k) for k in SPOT_KEYS}  # no notices, no autoscaler
        cfg = with_overrides(candidate, {"train.steps": n, "runtime.plan": "never", "runtime.plan_probe_steps": 0,
                                         "run.eval_every": 0, "run.loggers": [], **spot,
                                         "run.run_dir": str(self.run_dir / "probes" / str(i))})
        if self.progress:
            tree = cfg.to_dict()
            knobs = " ".join(f"{k}={dotted_get(tree, k)}" for k in KNOBS)
            print(f"runtime.plan: probe {i}, {n} RL steps of {knobs}", flush=True)
        probe = RayDriver(cfg, progress=False, evaluate=False, finish=False)
        probe.train()
        run = contract(cfg)
        fn = MeasuredDurations(MeasuredCosts.from_lines(lines), run, slowdown(cfg, run, cores))
        return RuntimeCosts.measure(probe.trace.spans, fn, steps=(1, n - 2))

    def _train_emulated(self) -> dict[str, Any]:
        """runtime.compute=emulated: this config's contract (pools, data shape, shards,
        segments) on Ray actors that sleep the cost model's time of each unit on the
        testbed's hardware (digenrl.sim.workload); trace and summary only."""
        from digenrl.runtime.cluster import session
        from digenrl.runtime.emulated import run_scheduler_emulated
        from digenrl.sim.costs import default_cost_model
        from digenrl.sim.testbed import load_testbed
        from digenrl.sim.workload import duration_fn
        from digenrl.io.trace import bubble_ratios, staleness

        rt = self.cfg.runtime
        run = contract(self.cfg)
        fn = duration_fn(self.cfg, load_testbed(rt.testbed), default_cost_model(), run)
        if rt.rollout.preemptible:  # the trace's notices and joins on the modelled clock
            self.preemption = Preemption(self.notices if self.notices is not None else spot_sources(self.cfg))
        with session(rt.address):
            self._trace = run_scheduler_emulated(Scheduler(run.sched, run.workers()), fn, rt.time_scale,
                                                 stall_s=rt.stall_timeout_s, preemption=self.preemption)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_chrome_trace(self.trace, str(self.run_dir / "trace.json"))
        plot_gantt(self.trace, str(self.run_dir / "gantt.png"))
        summary = {"mode": self.cfg.run.mode, "compute": "emulated", "testbed": rt.testbed,
                   "steps": self.cfg.train.steps, "modelled_s": self.trace.end,
                   "bubble": bubble_ratios(self.trace), "staleness": staleness(self.trace),
                   "run_dir": str(self.run_dir), "trace": str(self.run_dir / "trace.json"),
                   "gantt": str(self.run_dir / "gantt.png")}
        if self.preemption is not None:
            summary["spot"] = self.spot = dict(self.preemption.stats)
            _write_jsonl(self.run_dir / "spot.jsonl", self.preemption.log)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary

    def _get(self, what: str, ref, deadline: str):
        """ray.get(ref) within runtime.<deadline>_timeout_s ("start" or "stall"), else WaitTimeout."""
        return within(self.cfg.runtime, deadline, {what: ref}, what)[what]

    def _hook(self, wid: str, unit: Unit) -> None:
        if self.on_dispatch is not None:
            self.on_dispatch(self, wid, unit)

    def _finish(self) -> dict[str, Any]:
        run = self.run_dir
        state, ema = self._get("trainer 0's final weights", self.actors.trainer0.final_state(), "start")
        extra: dict[str, Any] = {"scheduler": self.stats}
        if self.spot is not None:
            extra["spot"] = self.spot
        if self.trace_log is not None:
            extra.update(trace_log=str(self.trace_log), **build_outputs(self.trace_log, run))
        if self.here is not None:
            extra["plan"] = self.here.describe()
            extra["predicted_samples_per_s"] = self.here.rate  # beside the achieved rate (RunRecorder.finish)
        # the final weights have taken max(resumed step, train.steps) steps (no loop past the end)
        return self.recorder.finish(state, ema, steps=max(self.base, self.cfg.train.steps), wall_s=self.wall_s,
                                    extra=extra)


def _write_jsonl(path: Path, records: list[dict]) -> None:
    """`records` as JSON lines (spot.jsonl: each notice, join and kill of a run's spot workers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _planned(cfg: Config, checkpoint) -> Config:
    """`cfg` with the planned knobs of the run that wrote `checkpoint` (its state.json)."""
    from digenrl.config.schema import dotted_get, with_overrides
    from digenrl.sim.here import KNOBS

    ran = json.loads((checkpoint / "state.json").read_text())["config"]
    return with_overrides(cfg, {k: dotted_get(ran, k) for k in KNOBS})


def _eval_samples(cfg: Config) -> int:
    """Samples of one held-out evaluation (train/evaluation.py): its prompts x data.eval_samples."""
    from digenrl.data import load_rows

    rows = load_rows(cfg.data.held_out_prompts(), held_out=True)
    return min(len(rows.prompts), cfg.data.eval_max_prompts) * cfg.data.eval_samples


def _profile_here(cfg: Config) -> tuple[list[dict], int]:
    """A Ray task on one trainer-pool slot: calibration lines of this config's policy and
    rewarder (digenrl.profile.profile_run), and the cores of the node it ran on."""
    import os

    from digenrl.profile import profile_run

    return profile_run(cfg), os.cpu_count() or 1
