"""RayTrainer: the Flow-GRPO run of `digenrl.trainer.Trainer`, on Ray pools, in any mode.

    driver (this process)                      Ray actors (digenrl.runtime.workers)
    ---------------------                      ------------------------------------
    Scheduler.assign() --unit--> dispatch -->  rollout-i  generate / reward / load_weights
         ^                                     trainer-j  train / optimizer_step (all-reduce)
         |   ray.wait(info refs)                          [/ TAG generate / eval / save]
         +-- complete / worker_lost <-------   reward-k   reward
    rewards -> advantages (per micro-batch)    Trajectories and weights move actor -> actor
    metrics.jsonl, trace.json, gantt.png       as ObjectRefs; the driver only sees `info`

Outputs mirror the single-device trainer (metrics.jsonl with the same required keys, eval
on held-out prompts by trainer 0, checkpoints by trainer 0 in the same format, so
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
import torch

from digenrl.config import Config
from digenrl.data import PromptSource, load_prompts
from digenrl.math import group_advantages
from digenrl.outputs import MetricsLog
from digenrl.recorder import RunRecorder
from digenrl.runtime import weight_sync
from digenrl.runtime.cluster import PoolPlacement, actor_options, connect
from digenrl.runtime.loop import EventLoop
from digenrl.runtime.shards import covering, row_range
from digenrl.runtime.workers import PolicyWorker, RewardWorker
from digenrl.sched import (Generate, OptimizerStep, Reward, SchedConfig, Scheduler, Train, Unit,
                           WeightSync, Worker)
from digenrl.trace import Trace, bubble_ratio, plot_gantt, write_chrome_trace
from digenrl.trainer import StepPlan, plan_step, step_metrics

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
        weight_sync.check_engine(cfg.runtime.weight_sync)
        self.cfg, self.progress, self.do_eval = cfg, progress, evaluate
        self.on_dispatch = on_dispatch
        self.run_dir = Path(cfg.run.run_dir)
        self.source = PromptSource(load_prompts(cfg.data.prompts), cfg.run.seed, cfg.data.groups_per_step)
        self.colocated = cfg.run.mode == "colocated"
        self._plans: dict[int, StepPlan] = {}
        self.handles: dict[str, Any] = {}  # worker id -> actor handle
        self.pids: dict[str, int] = {}
        self.workers: list[Worker] = []
        self.trained: list[tuple[int, int, int, int]] = []  # (step, group, sample, t), as trainers report
        self.trace: Optional[Trace] = None
        self.base = 0  # RL step the run starts from (resume)
        self._placements: list[PoolPlacement] = []
        self._n_replaced = 0

    # -- plan and scheduler config ---------------------------------------------------------
    def plan(self, step: int) -> StepPlan:
        if step not in self._plans:
            self._plans = {k: v for k, v in self._plans.items() if k >= step - 2}
            self._plans[step] = plan_step(self.cfg, self.source, step)
        return self._plans[step]

    def sched_config(self) -> SchedConfig:
        cfg, base = self.cfg, self.base
        return SchedConfig(
            mode=cfg.run.mode, rl_steps=cfg.train.steps - base,
            groups_per_step=cfg.data.groups_per_step, group_size=cfg.data.group_size,
            num_steps=cfg.sampling.num_steps,
            trained_steps=lambda s: self.plan(base + s).trained_steps,
            micro_batch_groups=cfg.data.micro_batch_groups, tsp_chunk=cfg.train.tsp_chunk or 1,
            tag_segment=cfg.runtime.tag_segment, rollout_segment=cfg.runtime.rollout_segment or None,
            gen_shard=cfg.runtime.gen_shard, train_shard=cfg.runtime.train_shard)

    # -- pools -----------------------------------------------------------------------------
    def _pools(self) -> list[tuple[str, Any, int]]:
        rt = self.cfg.runtime
        if self.colocated:  # every device generates and trains: both pools' devices, trainer-sized
            return [("colocated", rt.trainer, rt.rollout.workers + rt.trainer.workers),
                    ("reward", rt.reward, rt.reward.workers)]
        return [("trainer", rt.trainer, rt.trainer.workers), ("rollout", rt.rollout, rt.rollout.workers),
                ("reward", rt.reward, rt.reward.workers)]

    def _start_workers(self) -> None:
        for role, pool, n in self._pools():
            if n == 0:
                continue
            pg = None
            if role in ("trainer", "colocated"):
                pg = PoolPlacement(pool, n, name=role)
                self._placements.append(pg)
            for i in range(n):
                wid = f"{role}-{i}"
                opts = pg.options(pool, i) if pg is not None else actor_options(pool)
                self._spawn(Worker(wid, role), opts)
        self.pids.update(zip(self.handles, ray.get([h.ready.remote() for h in self.handles.values()])))
        trainers = self.train_ids
        if len(trainers) > 1:
            addr = ray.get(self.handles[trainers[0]].dist_address.remote())
            ray.get([self.handles[w].init_dist.remote(addr, r, len(trainers)) for r, w in enumerate(trainers)])

    def _spawn(self, worker: Worker, opts: dict) -> None:
        cls = RewardWorker if worker.role == "reward" else PolicyWorker
        self.handles[worker.id] = ray.remote(cls).options(**opts).remote(self.cfg, worker.role, worker.id)
        self.workers.append(worker)

    def replace(self, old: Worker) -> Worker:
        """A fresh actor for a lost rollout/reward worker; the scheduler syncs its weights."""
        try:
            ray.kill(self.handles.pop(old.id), no_restart=True)
        except Exception:  # already gone
            pass
        self._n_replaced += 1
        new = Worker(f"{old.id.split('#')[0]}#{self._n_replaced}", old.role)
        pool = self.cfg.runtime.reward if old.role == "reward" else self.cfg.runtime.rollout
        self._spawn(new, actor_options(pool))
        log.warning("worker %s lost; replaced by %s", old.id, new.id)
        return new

    @property
    def train_ids(self) -> list[str]:
        return [w.id for w in self.workers if w.role in ("trainer", "colocated")]

    def _shutdown(self) -> None:
        for h in self.handles.values():
            try:
                ray.get(h.shutdown.remote(), timeout=10)
            except Exception:
                pass
            ray.kill(h)
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
        started = connect(cfg.runtime.address, [(p, n) for _, p, n in self._pools()])
        try:
            self._start_workers()
            t0, rec = self.handles[self.train_ids[0]], self.recorder
            resumed_from, wall0 = None, 0.0
            latest = rec.resume_checkpoint() if resume else None
            if latest is not None:
                steps = ray.get([self.handles[w].load.remote(str(latest)) for w in self.train_ids])
                self.base = resumed_from = steps[0]
                wall0 = json.loads((latest / "state.json").read_text()).get("wall_s", 0.0)
            # Version `base` everywhere: trainer 0's weights (also fixes LoRA's random init).
            weights0 = t0.publish.remote()
            ray.get([self.handles[w.id].load_weights.remote(None, self.base, weights0)
                     for w in self.workers if w.role != "reward" and w.id != self.train_ids[0]])
            rec.open(resumed_from)
            try:
                if self.do_eval and rec.eval_due(self.base):  # the base model, on a fresh run
                    rec.log({"step": self.base, **ray.get(t0.evaluate.remote(self.base))})
                if self.base < cfg.train.steps:
                    backend = RealBackend(self, rec, weights0, wall0)  # logs through the recorder
                    sched = Scheduler(self.sched_config(), self.workers)
                    loop = EventLoop(sched, backend, on_dispatch=self._hook)
                    backend.loop = loop
                    self.trace = loop.run()
                    backend.flush(block=True)
                    self.stats = dict(sched.stats)
                    self.wall_s = backend.wall_s
                else:
                    self.stats, self.wall_s = {}, wall0
            finally:
                rec.close()
            return self._finish()
        finally:
            self._shutdown()
            if started:
                ray.shutdown()

    def _train_emulated(self) -> dict[str, Any]:
        """runtime.compute=emulated: the testbed's workload on sleeping actors; trace only."""
        from digenrl.runtime.emulated import run_emulated
        from digenrl.trace import bubble_ratios, staleness

        rt = self.cfg.runtime
        self.trace = run_emulated(rt.testbed, self.cfg.run.mode, steps=self.cfg.train.steps,
                                  time_scale=rt.time_scale)
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
        # the final weights have taken max(resumed step, train.steps) steps (no loop past the end)
        return self.recorder.finish(state, ema, steps=max(self.base, self.cfg.train.steps), wall_s=self.wall_s,
                                    extra=extra)


class RealBackend:
    """What each unit means with real models: actor calls, object refs, per-step metrics."""

    def __init__(self, rt: RayTrainer, mlog: MetricsLog, weights0, wall0: float):
        self.rt, self.mlog, self.cfg = rt, mlog, rt.cfg
        self.base = rt.base
        self.loop: Optional[EventLoop] = None
        self.out: dict[str, ray.ObjectRef] = {}  # worker id -> big output of its unit in flight
        # (step, mb) -> Generate sample shard (None = unsharded) -> its latest segment
        self.trajs: dict[tuple[int, int], dict] = {}
        self.rewards: dict[tuple[int, int], dict] = {}
        self.adv: dict[tuple[int, int], torch.Tensor] = {}
        self.weights: dict[int, ray.ObjectRef] = {0: weights0}  # sched version -> payload
        self.opt: dict[int, dict[str, dict]] = {}  # step -> worker -> optimizer info
        self.stale: dict[int, int] = {}
        self.syncs: list[dict] = []  # WeightSync infos since the last step record
        self.publisher = None if rt.colocated else rt.train_ids[0]
        self.records: list[tuple[dict, Optional[ray.ObjectRef]]] = []
        self.saves: list[ray.ObjectRef] = []
        self.last_end, self.wall0, self.wall_s = 0.0, wall0, wall0

    # -- dispatch ----------------------------------------------------------------------------
    def dispatch(self, wid: str, unit: Unit) -> ray.ObjectRef:
        h, b, T = self.rt.handles[wid], self.base, type(unit)
        if T is Generate:
            plan = self.rt.plan(b + unit.step)
            mb = plan.micro_batches[unit.mb]
            prompts, coords = mb.prompts, mb.coords
            if unit.samples is not None:  # a sample shard: only its rows (same per-sample noise)
                first, last = unit.samples
                prompts, coords = prompts[first:last], coords[first:last]
            prev = self.trajs[(unit.step, unit.mb)][unit.samples] if unit.t_start > 0 else None
            traj, info = h.generate.options(num_returns=2).remote(
                unit, b + unit.step, b + unit.version, prompts, coords, plan.spec, prev)
            self.out[wid] = traj
            return info
        if T is Reward:  # every Generate shard of the micro-batch, in row order
            shards = self.trajs[(unit.step, unit.mb)]
            n = len(self.rt.plan(b + unit.step).micro_batches[unit.mb].coords)
            refs, _ = covering(shards, (0, n), n)
            return h.reward.remote(unit, *refs)
        if T is Train:
            plan = self.rt.plan(b + unit.step)
            n = len(plan.micro_batches[unit.mb].coords)
            first, last = row_range(unit.samples, n)
            refs, offset = covering(self.trajs[(unit.step, unit.mb)], (first, last), n)
            adv = self._advantages(unit)[first:last]
            return h.train.remote(unit, adv, plan.spec, plan.samples, len(plan.trained_steps),
                                  (first - offset, last - offset), *refs)
        if T is OptimizerStep:
            payload, info = h.optimizer_step.options(num_returns=2).remote(
                unit, b + unit.version, wid == self.publisher)
            self.out[wid] = payload
            return info
        assert T is WeightSync
        return h.load_weights.remote(unit, b + unit.version, self.weights[unit.version])

    def _advantages(self, unit: Train) -> torch.Tensor:
        key = (unit.step, unit.mb)
        if key not in self.adv:
            cfg = self.cfg.reward
            if cfg.adv_std == "global":  # batch-level modes only (config check): whole step
                keys = sorted(k for k in self.rewards if k[0] == unit.step)
                r = torch.cat([self.rewards[k]["rewards"] for k in keys])
                g = torch.cat([self.rewards[k]["group_ids"] for k in keys])
                a = group_advantages(r, g, std=cfg.adv_std, clip=cfg.adv_clip)
                for k, part in zip(keys, a.split([len(self.rewards[k]["rewards"]) for k in keys])):
                    self.adv[k] = part
            else:  # whole groups per micro-batch: the same numbers as over the whole step
                r = self.rewards[key]
                self.adv[key] = group_advantages(r["rewards"], r["group_ids"], std=cfg.adv_std,
                                                 clip=cfg.adv_clip)
        return self.adv[key]

    # -- completions ---------------------------------------------------------------------------
    def completed(self, wid: str, unit: Unit, info: dict) -> None:
        T = type(unit)
        if T is Generate:
            self.trajs.setdefault((unit.step, unit.mb), {})[unit.samples] = self.out.pop(wid)
        elif T is Reward:
            self.rewards[(unit.step, unit.mb)] = info
        elif T is Train:
            self.rt.trained.extend(info["trained"])
            lag = unit.step - unit.traj_version
            self.stale[unit.step] = max(self.stale.get(unit.step, lag), lag)
        elif T is OptimizerStep:
            self.opt.setdefault(unit.step, {})[wid] = info
            payload = self.out.pop(wid)
            if wid == self.publisher:
                self.weights[unit.version] = payload
                for v in [v for v in self.weights if v < unit.version - 2]:
                    del self.weights[v]  # lag <= 1: nobody pulls older versions
        else:
            self.syncs.append(info)

    def replace(self, worker: Worker) -> Worker:
        self.out.pop(worker.id, None)
        return self.rt.replace(worker)

    def step_done(self, step: int, now: float) -> None:
        """Sched step `step` finished (all optimizer steps reported): one metrics record."""
        cfg, rt = self.cfg, self.rt
        keys = sorted(k for k in self.rewards if k[0] == step)
        rows = [_Rewarded(self.rewards[k]["rewards"], self.rewards[k]["parts"]) for k in keys]
        infos = self.opt.pop(step)
        m = step_metrics(rows, _combine_learner(infos, rt.train_ids[0]))
        for k in keys:
            self.rewards.pop(k)
            self.adv.pop(k, None)
            self.trajs.pop(k, None)
        real = self.base + step + 1
        step_s = now - self.last_end
        self.wall_s = self.wall0 + now
        pub = infos.get(self.publisher, {}) if self.publisher else {}
        bubbles = self._bubbles(self.last_end, now)
        record = {
            "step": real, **m, "mode": cfg.run.mode,
            "staleness_max": self.stale.pop(step, 0),
            "bubble_ratio_rollout": bubbles.get("rollout", bubbles.get("colocated", 0.0)),
            "bubble_ratio_trainer": bubbles.get("trainer", bubbles.get("colocated", 0.0)),
            "weight_sync_s": pub.get("publish_s", 0.0) + sum(i["end"] - i["start"] for i in self.syncs),
            "weight_sync_bytes": sum(i["bytes"] for i in self.syncs),
            "timing/publish_bytes": pub.get("publish_bytes", 0),
            "timing/allreduce_s": max(i["reduce_s"] for i in infos.values()),
            "step_s": step_s, "wall_s": self.wall_s, "samples_per_s": m["samples"] / step_s,
        }
        self.syncs = []
        self.last_end = now
        t0 = rt.handles[rt.train_ids[0]]
        eval_ref = None
        if rt.do_eval and rt.recorder.eval_due(real):
            eval_ref = t0.evaluate.remote(real)  # queued before any new unit: these weights
        if rt.recorder.checkpoint_due(real):
            self.saves.append(t0.save.remote(real, self.wall_s))
        self.records.append((record, eval_ref))
        self.flush(block=False)

    def _bubbles(self, t0: float, t1: float) -> dict[str, float]:
        tr = self.loop.trace
        live = Trace(spans=tr.spans + self.loop.in_flight(), workers=tr.workers, alive=tr.alive, end=t1)
        return {p: bubble_ratio(live, p, t0, t1) for p in set(tr.workers.values())}

    def flush(self, block: bool) -> None:
        """Write step records in order, each once its evaluation (if any) is done."""
        while self.records:
            record, ref = self.records[0]
            if ref is not None:
                if not block and not ray.wait([ref], timeout=0)[0]:
                    return
                record.update(ray.get(ref))
            self.records.pop(0)
            self.mlog.log(record)  # the RunRecorder: metrics.jsonl, progress bar, step line
        if block:
            ray.get(self.saves)


class _Rewarded:
    """What `step_metrics` reads of a micro-batch: its rewards (the driver never holds images)."""

    def __init__(self, rewards: torch.Tensor, parts: dict):
        self.rewards, self.reward_parts = rewards, parts


def _combine_learner(infos: dict[str, dict], first: str) -> dict[str, float]:
    """Learner metrics of the step over all trainers: sum of weighted sums / sum of weights."""
    lm = dict(infos[first]["metrics"])  # grad norm etc.: identical after the all-reduce
    w = sum(i["weight"] for i in infos.values()) or 1.0
    keys = {k for i in infos.values() for k in i["sums"] if k.startswith("loss/")}
    for k in keys:
        lm[k] = sum(i["sums"].get(k, 0.0) for i in infos.values()) / w
    lm["train/skipped_units"] = sum(i["sums"].get("train/skipped_units", 0.0) for i in infos.values())
    return lm
