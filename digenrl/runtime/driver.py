"""RayTrainer: the Flow-GRPO run of `digenrl.trainer.Trainer`, on Ray pools, in any mode.

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

This module owns the actors and the run's lifecycle (pools, planning, resume, evaluation
actor, emulated compute, shutdown); runtime/backend.py owns what each unit means.

Outputs mirror the single-device trainer (metrics.jsonl with the same required keys, eval
on held-out prompts by the evaluation actor, checkpoints by trainer 0 in the same format, so
`--resume` works across local and Ray runs, final/policy.safetensors, reward plot,
summary.json) plus `trace.json` (Perfetto) and `gantt.png`. Per-step metrics add `mode`,
`staleness_max`, `bubble_ratio_rollout`, `bubble_ratio_trainer`, `weight_sync_s`,
`weight_sync_bytes`.

The run directory must be on storage every node sees (trainer 0 writes checkpoints and
eval samples there; the driver writes the rest).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Optional

import ray

from digenrl.config import Config
from digenrl.contract import RunContract, contract
from digenrl.recorder import RunRecorder
from digenrl.runtime.cluster import PLACEMENT_TIMEOUT_S, PoolPlacement, actor_options, connect
from digenrl.runtime.backend import RealBackend
from digenrl.runtime.elastic import Elastic
from digenrl.runtime.gang import Gang
from digenrl.runtime.loop import EventLoop
from digenrl.runtime.workers import EvalWorker, PolicyWorker, RewardWorker
from digenrl.sched import Scheduler, Unit, Worker
from digenrl.trace import Trace, plot_gantt, write_chrome_trace
from digenrl.trainer import StepPlan, plan_step, prompt_source

log = logging.getLogger(__name__)


class RayTrainer:
    """`RayTrainer(cfg).train(resume=False) -> summary`, for every run.mode except local.

    evaluate=False skips held-out evaluation (benchmarks). `on_dispatch(trainer, worker_id,
    unit)` is called before each unit is sent (tests inject faults with it).
    """

    def __init__(self, cfg: Config, *, progress: bool = True, evaluate: bool = True,
                 on_dispatch: Optional[Callable[["RayTrainer", str, Unit], None]] = None):
        if cfg.run.mode == "local":
            raise ValueError("run.mode=local runs the single-device Trainer, not the Ray runtime")
        self.cfg, self.progress, self.do_eval = cfg, progress, evaluate
        self.on_dispatch = on_dispatch
        self.run_dir = Path(cfg.run.run_dir)
        self.source = prompt_source(cfg)  # conditioned families: rows with images, looked up by workers
        self.colocated = cfg.run.mode == "colocated"
        self._plans: dict[int, StepPlan] = {}
        self.handles: dict[str, Any] = {}  # worker id -> actor handle
        self.pids: dict[str, int] = {}  # worker id -> its (rank 0) process
        self.rank_pids: dict[str, list[int]] = {}  # worker id -> the process of each gang rank
        self.serving: list = []  # weight_sync=nccl: refs of the relay's sends in flight
        self.workers: list[Worker] = []
        self.trained: list[tuple[int, int, int, int]] = []  # (step, group, sample, t), as trainers report
        self.trace: Optional[Trace] = None
        self.base = 0  # RL step the run starts from (resume)
        self._placements: list[PoolPlacement] = []
        self.here = None  # digenrl.sim.here.HerePlan when runtime.plan planned this run
        self.evaluator = None  # the EvalWorker actor, started at the first evaluation
        self._n_replaced = 0
        self.elastic = None  # runtime/elastic.Elastic while the event loop runs (digenrl scale)

    # -- plan and scheduler config ---------------------------------------------------------
    def plan(self, step: int) -> StepPlan:
        if step not in self._plans:
            self._plans = {k: v for k, v in self._plans.items() if k >= step - 2}
            self._plans[step] = plan_step(self.cfg, self.source, step)
        return self._plans[step]

    def contract(self) -> RunContract:
        """The scheduler config and pools of this run, from RL step `base` on (digenrl.contract)."""
        return contract(self.cfg, start_step=self.base, trained=lambda step: self.plan(step).trained_steps)

    # -- pools -----------------------------------------------------------------------------
    def _start_workers(self, pools) -> None:
        """One Gang per scheduler worker: runtime.trainer.gang actors per trainer and
        runtime.rollout.gang per rollout worker (one placement group for the pool, a bundle
        per device), one actor per reward worker. A rollout gang forms its own process group
        and runs sequence-parallel (`_init_sp`)."""
        for p in pools:
            if p.workers == 0:
                continue
            gang = p.resources.gang if p.role != "reward" else 1
            pg = None
            if gang > 1 or p.role in ("trainer", "colocated"):  # collectives: packed on few nodes
                pg = PoolPlacement(p.resources, p.workers * gang, name=p.role)
                self._placements.append(pg)
            for i in range(p.workers):
                opts = [pg.options(p.resources, i * gang + r) if pg is not None else actor_options(p.resources)
                        for r in range(gang)]
                self._spawn(Worker(f"{p.role}-{i}", p.role), opts)
        pids = [ray.get(h.ready.all()) for h in self.handles.values()]
        self.rank_pids.update(zip(self.handles, pids))
        self.pids.update({w: ranks[0] for w, ranks in self.rank_pids.items()})
        for w in self.workers:
            if w.role == "rollout" and self.cfg.runtime.rollout.gang > 1:
                self._init_sp(w.id)
        trainers = self.train_ids
        tc = self.cfg.runtime.trainer
        if len(trainers) > 1 or tc.shard == "fsdp":
            ranks = [a for w in trainers for a in self.handles[w].ranks]
            addr = ray.get(ranks[0].dist_address.remote())
            ray.get([a.init_dist.remote(addr, r, len(ranks), len(trainers), tc.gang) for r, a in enumerate(ranks)])

    def _spawn(self, worker: Worker, opts: list[dict]) -> None:
        cls = RewardWorker if worker.role == "reward" else PolicyWorker
        if self.cfg.runtime.weight_sync == "nccl" and worker.role in ("trainer", "colocated"):
            actor = ray.remote(concurrency_groups={"relay": 1})(cls)  # the relay's own thread
        else:
            actor = ray.remote(cls)
        self.handles[worker.id] = Gang([actor.options(**o).remote(self.cfg, worker.role, worker.id, r)
                                        for r, o in enumerate(opts)])
        self.workers.append(worker)

    def _init_sp(self, wid: str) -> None:
        """Rollout gang `wid`'s ranks join their own process group (sequence parallelism)."""
        ranks = self.handles[wid].ranks
        addr = ray.get(ranks[0].dist_address.remote())
        ray.get([a.init_sp.remote(addr, r, len(ranks)) for r, a in enumerate(ranks)])

    def replace(self, old: Worker) -> Worker:
        """A fresh actor for a lost rollout/reward worker; the scheduler syncs its weights."""
        self.handles.pop(old.id).kill()
        self._n_replaced += 1
        new = Worker(f"{old.id.split('#')[0]}#{self._n_replaced}", old.role)
        pool = self.cfg.runtime.reward if old.role == "reward" else self.cfg.runtime.rollout
        self._spawn(new, [actor_options(pool)] * (pool.gang if old.role == "rollout" else 1))
        try:  # a lost node may have been the only one with room for this pool: say so, not hang
            ray.get(self.handles[new.id].ready.all(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"replacing lost worker {old.id}: no node can host a {old.role} worker "
                f"(num_cpus={pool.num_cpus}, num_gpus={pool.num_gpus}, resources={pool.resources}) "
                f"within {PLACEMENT_TIMEOUT_S:.0f}s; available: {ray.available_resources()}") from None
        if old.role == "rollout" and pool.gang > 1:
            self._init_sp(new.id)
        if self.cfg.runtime.weight_sync == "nccl" and new.role == "rollout":
            self.join_relay(new.id)  # its first WeightSync pulls from the relay
        log.warning("worker %s lost; replaced by %s", old.id, new.id)
        return new

    # -- elastic rollout pool (runtime/elastic.py) -----------------------------------------------
    def add_rollout(self) -> tuple[Worker, list]:
        """Start one more rollout worker's actors (the options `replace` uses); returns it and
        its ranks' ready refs. It joins the scheduler once they resolve (`admit`)."""
        pool = self.cfg.runtime.rollout
        n = sum(1 for w in self.workers if w.role == "rollout" and "#" not in w.id)
        new = Worker(f"rollout-{n}", "rollout")
        self._spawn(new, [actor_options(pool)] * pool.gang)
        return new, self.handles[new.id].ready.all()

    def admit(self, worker: Worker, pids: list[int]) -> None:
        """`worker`'s actors are up (`pids`, one per rank): its sequence-parallel group and, with
        weight_sync=nccl, its pair group with the relay; its first WeightSync loads the weights."""
        self.rank_pids[worker.id], self.pids[worker.id] = pids, pids[0]
        if self.cfg.runtime.rollout.gang > 1:
            self._init_sp(worker.id)
        if self.cfg.runtime.weight_sync == "nccl":
            self.join_relay(worker.id)

    def retire(self, worker: Worker, lost: bool = False) -> None:
        """Stop a worker that left the pools (drained, or cancelled while starting)."""
        h = self.handles.pop(worker.id, None)
        if h is not None:
            h.kill()
        self.pids.pop(worker.id, None)
        self.rank_pids.pop(worker.id, None)
        if self.cfg.runtime.weight_sync == "nccl" and worker.role == "rollout":
            self._relay().relay_close.options(concurrency_group="relay").remote(worker.id)
        if self.elastic is not None:
            self.elastic.left(worker, lost=lost)

    # -- the weight relay (runtime.weight_sync=nccl) -----------------------------------------------
    def _relay(self):
        """The publishing trainer's rank 0, which hosts the relay; its relay calls run on the
        actor's "relay" thread, so a pull never waits for the trainer's units (TCSS)."""
        return self.handles[self.train_ids[0]].ranks[0]

    def join_relay(self, wid: str) -> None:
        """Form rollout worker `wid`'s pair group with the relay (at start, and for a replacement)."""
        relay = self._relay()
        address = ray.get(relay.relay_open.options(concurrency_group="relay").remote(wid))
        accepted = relay.relay_accept.options(concurrency_group="relay").remote(wid)
        # rank 0 of a rollout gang: it broadcasts each version to the others (receive_weights)
        ray.get([self.handles[wid].ranks[0].relay_connect.remote(address), accepted])

    def pull(self, wid: str, unit, version: int) -> list:
        """Rollout worker `wid` receives `version` from the relay: the worker's result refs (the
        relay's send is tracked in `self.serving` and checked at every step)."""
        self.serving.append(self._relay().relay_serve.options(concurrency_group="relay").remote(wid, version))
        return self.handles[wid].receive_weights.all(unit, version)

    @property
    def train_ids(self) -> list[str]:
        return [w.id for w in self.workers if w.role in ("trainer", "colocated")]

    def _shutdown(self) -> None:
        for h in self.handles.values():
            try:
                ray.get(h.shutdown.all(), timeout=10)
            except Exception:
                pass
            h.kill()
        if self.evaluator is not None and self.evaluator not in self.handles.values():
            ray.kill(self.evaluator)
        self.evaluator = None
        self.handles.clear()
        for pg in self._placements:
            pg.remove()
        self._placements.clear()

    # -- the run -----------------------------------------------------------------------------
    def train(self, *, resume: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        if cfg.runtime.compute == "emulated":
            return self._train_emulated()
        self.recorder = RunRecorder(cfg, progress=self.progress)  # files, cadence, bar, summary
        latest = self.recorder.resume_checkpoint() if resume else None
        pools = contract(cfg).pools
        started = connect(cfg.runtime.address, [(p.resources, p.workers * p.resources.gang) for p in pools])
        try:
            if cfg.wants_plan():  # a resumed run keeps the plan its checkpoint was made with
                cfg = self.cfg = self._plan_here() if latest is None else _planned(cfg, latest)
                self.recorder = RunRecorder(cfg, progress=self.progress)  # config.json: the planned run
                pools = contract(cfg).pools
            self._start_workers(pools)
            t0, rec = self.handles[self.train_ids[0]], self.recorder
            resumed_from, wall0 = None, 0.0
            if latest is not None:
                steps = ray.get([r for w in self.train_ids for r in self.handles[w].load.all(str(latest))])
                self.base = resumed_from = steps[0]
                wall0 = json.loads((latest / "state.json").read_text()).get("wall_s", 0.0)
            # Version `base` everywhere: trainer 0's weights (also fixes LoRA's random init).
            weights0 = t0.publish.remote()
            sharded = cfg.runtime.trainer.shard == "fsdp"  # trainer ranks start equal (broadcast, load)
            relay = cfg.runtime.weight_sync == "nccl"  # rollout workers: from the relay, not the store
            ray.get([self.handles[w.id].load_weights.remote(None, self.base, weights0) for w in self.workers
                     if w.role not in ("reward", "rollout" if relay else "") and w.id != self.train_ids[0]
                     and not (sharded and w.id in self.train_ids)])
            if relay:
                ray.get(weights0)  # the relay holds version `base` once the publish is done
                for w in self.workers:
                    if w.role == "rollout":
                        self.join_relay(w.id)
                        ray.get(self.pull(w.id, None, self.base))
            rec.open(resumed_from)
            try:
                first = self.evaluate(self.base) if rec.eval_due(self.base) else None  # overlaps step 1
                if self.base < cfg.train.steps:
                    backend = RealBackend(self, rec, weights0, wall0)  # logs through the recorder
                    if first is not None:
                        backend.records.append(({"step": self.base}, first))
                    sched = Scheduler(self.contract().sched, self.workers)
                    self.elastic = Elastic(self, self.run_dir)  # `digenrl scale` requests
                    loop = EventLoop(sched, backend, on_dispatch=self._hook, poll=self.elastic.poll)
                    backend.loop = loop
                    self.elastic.start(loop)
                    try:
                        self.trace = loop.run()
                    finally:
                        self.elastic.close()
                        self.elastic = None
                    backend.flush(block=True)
                    self.stats = dict(sched.stats)
                    self.wall_s = backend.wall_s
                else:
                    if first is not None:
                        rec.log({"step": self.base, **ray.get(first)})
                    self.stats, self.wall_s = {}, wall0
            finally:
                rec.close()
            return self._finish()
        finally:
            self._shutdown()
            if started:
                ray.shutdown()

    def _eval_pool(self):
        """What the evaluation actor reserves: a device like those that generate (rollout
        pool; trainer pool when colocated or without rollout workers), but no CPU slot (on a
        CPU it is niced and takes idle cycles only)."""
        from dataclasses import replace

        rt = self.cfg.runtime
        generating = rt.rollout if self.cfg.run.mode != "colocated" and rt.rollout.workers else rt.trainer
        return replace(generating, num_cpus=0.0)

    def evaluate(self, step: int) -> Optional[ray.ObjectRef]:
        """Held-out evaluation of trainer 0's current weights; returns the ref of its metrics
        (None with evaluate=False). Call it before any unit of the next step is sent: trainer
        0 copies its weights in call order. On the evaluation actor, so training does not
        wait; on trainer 0 itself (training waits) when the cluster has no free device for it."""
        if not self.do_eval:
            return None
        t0 = self.handles[self.train_ids[0]]
        if self.evaluator is None:
            pool = self._eval_pool()
            if pool.num_gpus > ray.available_resources().get("GPU", 0.0):
                log.warning("no free GPU for the evaluation actor: trainer 0 evaluates between steps, "
                            "and training waits for it")
                self.evaluator = t0
            else:
                self.evaluator = ray.remote(EvalWorker).options(**actor_options(pool)).remote(self.cfg)
        if self.evaluator is t0:
            return t0.evaluate.remote(step)
        return self.evaluator.evaluate.remote(step, t0.eval_weights.remote())

    def _plan_here(self) -> Config:
        """runtime.plan: time each unit kind on a trainer-pool worker (digenrl.profile), then
        pick the knobs the config leaves open on the simulator (digenrl.sim.here)."""
        from digenrl.config import with_overrides
        from digenrl.sim.here import plan_here

        cfg, rt = self.cfg, self.cfg.runtime
        opts = {k: v for k, v in actor_options(rt.trainer).items() if k not in ("max_restarts", "max_task_retries")}
        lines, cores = ray.get(ray.remote(_profile_here).options(**opts).remote(cfg))
        # GPU workers share no cores; CPU workers share the node's
        gpu = all(p.resources.num_gpus > 0 for p in contract(cfg).pools if p.workers and p.role != "reward")
        self.here = plan_here(cfg, lines, cores=10**6 if gpu else cores, given=cfg.given)
        if self.progress:
            print(self.here.describe(), flush=True)
        return with_overrides(cfg, self.here.overrides)

    def _train_emulated(self) -> dict[str, Any]:
        """runtime.compute=emulated: this config's contract (pools, data shape, shards,
        segments) on Ray actors that sleep the cost model's time of each unit on the
        testbed's hardware (digenrl.sim.workload); trace and summary only."""
        from digenrl.runtime.cluster import session
        from digenrl.runtime.emulated import run_scheduler_emulated
        from digenrl.sim.costs import default_cost_model
        from digenrl.sim.testbed import load_testbed
        from digenrl.sim.workload import duration_fn
        from digenrl.trace import bubble_ratios, staleness

        rt = self.cfg.runtime
        run = contract(self.cfg)
        fn = duration_fn(self.cfg, load_testbed(rt.testbed), default_cost_model(), run)
        with session(rt.address):
            self.trace = run_scheduler_emulated(Scheduler(run.sched, run.workers()), fn, rt.time_scale)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_chrome_trace(self.trace, str(self.run_dir / "trace.json"))
        plot_gantt(self.trace, str(self.run_dir / "gantt.png"))
        summary = {"mode": self.cfg.run.mode, "compute": "emulated", "testbed": rt.testbed,
                   "steps": self.cfg.train.steps, "modelled_s": self.trace.end,
                   "bubble": bubble_ratios(self.trace), "staleness": staleness(self.trace),
                   "run_dir": str(self.run_dir), "trace": str(self.run_dir / "trace.json"),
                   "gantt": str(self.run_dir / "gantt.png")}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary

    def _hook(self, wid: str, unit: Unit) -> None:
        if self.on_dispatch is not None:
            self.on_dispatch(self, wid, unit)

    def _finish(self) -> dict[str, Any]:
        run = self.run_dir
        state, ema = ray.get(self.handles[self.train_ids[0]].final_state.remote())
        extra: dict[str, Any] = {"scheduler": self.stats}
        if self.trace is not None:
            write_chrome_trace(self.trace, str(run / "trace.json"))
            plot_gantt(self.trace, str(run / "gantt.png"))
            extra.update(trace=str(run / "trace.json"), gantt=str(run / "gantt.png"))
        if self.here is not None:
            extra["plan"] = self.here.describe()
        # the final weights have taken max(resumed step, train.steps) steps (no loop past the end)
        return self.recorder.finish(state, ema, steps=max(self.base, self.cfg.train.steps), wall_s=self.wall_s,
                                    extra=extra)


def _planned(cfg: Config, checkpoint) -> Config:
    """`cfg` with the planned knobs of the run that wrote `checkpoint` (its state.json)."""
    from digenrl.config import dotted_get, with_overrides
    from digenrl.sim.here import KNOBS

    ran = json.loads((checkpoint / "state.json").read_text())["config"]
    return with_overrides(cfg, {k: dotted_get(ran, k) for k in KNOBS})


def _profile_here(cfg: Config) -> tuple[list[dict], int]:
    """A Ray task on one trainer-pool slot: calibration lines of this config's policy and
    rewarder (digenrl.profile.profile_run), and the cores of the node it ran on."""
    import os

    from digenrl.profile import profile_run

    return profile_run(cfg), os.cpu_count() or 1
