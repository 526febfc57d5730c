"""RealBackend: what each scheduler unit means with real models, for the driver's event loop.

    dispatch(worker, unit)   one actor call per unit kind (STEP_TABLE's `call`), inputs passed
                             as ObjectRefs: Trajectories and weights move actor to actor
    completed(worker, unit)  what each kind's typed result feeds (STEP_TABLE's `done`):
                             trajectories, rewards -> advantages, staleness,
                             published weights, sync bytes
    step_done(step)          one metrics record per RL step (rewards, learner metrics over all
                             trainers, staleness, bubbles, weight-sync bytes and seconds), the
                             evaluation and checkpoint cadence; records are written in order

The RayDriver (runtime/driver.py) owns the run, runtime/actors.py the actors; this owns a
run's data flow, and talks to the actors and the recorder only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import ray
import torch

from digenrl.config.schema import Config
from digenrl.math import combine_rewards, group_advantages
from digenrl.io.recorder import RunRecorder
from digenrl.learner.metrics import merge_sums, step_means
from digenrl.runtime.actors import Actors
from digenrl.math.payload import row_share, train_rows
from digenrl.runtime.results import Done, Generated, Rewarded, Stepped, Synced, Trained, _add
from digenrl.runtime.shards import covering, row_range
from digenrl.runtime.waits import within
from digenrl.rollout.sampler import row_kept
from digenrl.sched import TAG_MODES, Generate, OptimizerStep, Reward, Train, Unit, WeightSync, Worker, by_kind
from digenrl.io.trace import Trace, bubble_ratio
from digenrl.train.trainer import StepPlan, plan_step, prompt_source, step_metrics


class StepPlans:
    """`plans(step)`: RL step `step`'s StepPlan (digenrl.train.trainer.plan_step), kept while the
    steps around it run (under TCSS two steps are in flight)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.source = prompt_source(cfg)  # conditioned families: rows with images, looked up by workers
        self._plans: dict[int, StepPlan] = {}

    def __call__(self, step: int) -> StepPlan:
        if step not in self._plans:
            self._plans = {k: v for k, v in self._plans.items() if k >= step - 2}
            self._plans[step] = plan_step(self.cfg, self.source, step)
        return self._plans[step]


class RealBackend:
    """What each unit means with real models: actor calls, object refs, per-step metrics."""

    def __init__(self, actors: Actors, recorder: RunRecorder, plans: StepPlans, base: int, weights0,
                 wall0: float):
        self.actors, self.recorder, self.plans, self.cfg = actors, recorder, plans, actors.cfg
        self.out: dict[str, ray.ObjectRef] = {}  # worker id -> big output of its unit in flight
        # (step, mb) -> rows [first, last) of a Generate shard (a unit's, or a gang rank's share
        # of it) -> its latest segment
        self.trajs: dict[tuple[int, int], dict] = {}  # (one object per row: rows (r, r + 1); ship_rows)
        # (step, mb) -> rows [first, last) of a finished Generate shard -> its decoded media (Reward)
        self.media: dict[tuple[int, int], dict] = {}
        # (step, mb) -> (row, denoising step) -> that latent of a finished row (rollout.sampler.ship_rows)
        self.latents: dict[tuple[int, int], dict] = {}
        self.traj_bytes: dict[int, int] = {}  # step -> trajectory bytes its Train units' ranks received
        self.rewards: dict[tuple[int, int], Rewarded] = {}  # assembled micro-batches
        # GAP's generation fragments scored so far: (step, mb) -> rows [first, last) -> Rewarded
        self.fragments: dict[tuple[int, int], dict[tuple[int, int], Rewarded]] = {}
        self.adv: dict[tuple[int, int], torch.Tensor] = {}
        self.weights: dict[int, ray.ObjectRef] = {base: weights0}  # version -> payload (base: the run's first)
        self.opt: dict[int, dict[str, Stepped]] = {}  # step -> worker -> its optimizer step
        self.stale: dict[int, int] = {}
        self.syncs: list[Synced] = []  # WeightSyncs since the last step record
        self.gen_comm: dict[int, dict] = {}  # step -> collective bytes its rollout gangs' Generate units issued
        # Advantages over the whole step: a global std, or micro-batches that cut prompt groups
        # (both only where nothing trains before the whole step is rewarded: config checks).
        self.whole_step = self.cfg.reward.adv_std == "global" or self.cfg.data.micro_batch_samples > 0
        # trainer 0 publishes when rollout workers pull (colocated workers, TAG-only pools: nobody)
        self.publisher = actors.train_ids[0] if any(w.role == "rollout" for w in actors.workers) else None
        self.records: list[tuple[dict, Optional[ray.ObjectRef]]] = []
        self.saves: list[ray.ObjectRef] = []
        self.last_end, self.wall0, self.wall_s = 0.0, wall0, wall0

    # -- dispatch: one actor call per unit kind ----------------------------------------------
    def dispatch(self, wid: str, unit: Unit) -> list[ray.ObjectRef]:
        """The unit on every rank of worker `wid`'s gang: one result ref per rank."""
        return STEP_TABLE[type(unit)].call(self, self.actors.gang(wid), wid, unit)

    def _call_generate(self, h, wid: str, unit: Generate) -> list[ray.ObjectRef]:
        """A Generate unit's rows (the micro-batch's, or its sample shard's) shared out over the
        ranks of `wid`'s gang (one rank: all of them); a continuation takes, per rank, the
        previous segment's shards that cover its rows, whoever generated them. FSDP needs every
        rank in every forward: a rank without rows generates the unit's first row as a ghost,
        whose output is dropped. Sequence parallelism: the rows are shared out over the gang's
        groups of sp consecutive ranks (a rollout gang is one group); every rank of a group
        runs the group's rows, and the first one's output is kept (the others' is the same)."""
        plan = self.plans(unit.step)
        mb = plan.micro_batches[unit.mb]
        first, last = row_range(unit.samples, len(mb.coords))
        shards = self.trajs.get((unit.step, unit.mb), {})
        outs, dones = [], []
        sp = self._sp(wid)
        for r, actor in enumerate(h.ranks):
            share = row_share(last - first, len(h) // sp, r // sp)
            a, z = first + share.start, first + share.stop
            ghost = a == z
            if ghost:
                a, z = first, first + 1
            prev, rows = [], (0, 0)
            if unit.t_start > 0:
                prev, offset = covering(shards, (a, z), len(mb.coords))
                rows = (a - offset, z - offset)
            kept = ([row_kept(plan.spec, c) for c in mb.coords[a:z]]
                    if unit.t_end == plan.spec.num_steps and plan.spec.reads != "all" else [])
            n_lat = sum(len(k) for k in kept)
            *objs, media, done = actor.generate.options(num_returns=z - a + n_lat + 2).remote(
                unit, unit.step, unit.version, mb.prompts[a:z], mb.coords[a:z], plan.spec, rows, *prev)
            if not ghost and r % sp == 0:  # objects per row (and latent): a trainer rank fetches only its own
                heads, lats = objs[:z - a], iter(objs[z - a:])
                latents = {(a + i, s): next(lats) for i, k in enumerate(kept) for s in k}
                outs.append(([((a + i, a + i + 1), ref) for i, ref in enumerate(heads)], ((a, z), media), latents))
            dones.append(done)
        self.out[wid] = outs
        return dones

    def _call_reward(self, h, wid: str, unit: Reward) -> ray.ObjectRef:
        """Score one generation fragment (the whole micro-batch when unsharded): the Generate
        shards covering its rows, in row order."""
        shards = self.media[(unit.step, unit.mb)]
        n = len(self.plans(unit.step).micro_batches[unit.mb].coords)
        refs, _ = covering(shards, row_range(unit.samples, n), n)
        if self._sp(wid) == len(h) > 1:  # one sequence-parallel group: its ranks hold the same images, rank 0 scores
            return [h.ranks[0].reward.remote(unit, *refs)]
        return h.reward(unit, *refs)

    def _sp(self, wid: str) -> int:
        """The sequence-parallel degree of worker `wid`'s gang."""
        rt = self.cfg.runtime
        role = self.actors.role(wid)
        return {"rollout": rt.rollout.gang, "trainer": rt.trainer.sp, "colocated": rt.trainer.sp}.get(role, 1)

    def _call_train(self, h, wid: str, unit: Train) -> list[ray.ObjectRef]:
        """The unit on every rank of `wid`'s gang, each rank receiving only the lean trajectory
        rows it trains (`train_rows`); one result ref per rank."""
        plan = self.plans(unit.step)
        n = len(plan.micro_batches[unit.mb].coords)
        first, last = row_range(unit.samples, n)
        shards = self.trajs[(unit.step, unit.mb)]
        adv = self._advantages(unit)[first:last]
        out = []
        latents = self.latents[(unit.step, unit.mb)]
        coords = plan.micro_batches[unit.mb].coords
        for r, actor in enumerate(h.ranks):
            (a, z), mine = train_rows(last - first, len(h), self._sp(wid), r, self.cfg.train.loss)
            heads, _ = covering(shards, (first + a, first + z), n)  # (one per row)
            steps = [list(row_kept(plan.spec, coords[i], unit.t_steps)) for i in range(first + a, first + z)]
            lats = [latents[(first + a + i, s)] for i, k in enumerate(steps) for s in k]
            out.append(actor.train.remote(unit, adv[a:z], plan.spec, plan.samples, len(plan.trained_steps),
                                          mine, last - first, steps, *heads, *lats))
        return out

    def _call_optimizer(self, h, wid: str, unit: OptimizerStep) -> ray.ObjectRef:
        outs = h.optimizer_step.options(num_returns=2)(unit, unit.version, wid == self.publisher)
        self.out[wid] = outs[0][0]  # rank 0 holds the published payload
        return [done for _, done in outs]

    def _call_sync(self, h, wid: str, unit: WeightSync) -> ray.ObjectRef:
        if self.cfg.runtime.weight_sync == "nccl":  # from the relay's chain (runtime/relay.py)
            return self.actors.pull(wid, unit, unit.version)
        return h.load_weights(unit, unit.version, self.weights[unit.version])

    def _advantages(self, unit: Train) -> torch.Tensor:
        key = (unit.step, unit.mb)
        if key not in self.adv:
            cfg = self.cfg.reward
            if self.whole_step:  # batch-level modes only (config checks): every mb is rewarded
                keys = sorted(k for k in self.rewards if k[0] == unit.step)
                r = torch.cat([self.rewards[k].rewards for k in keys])
                g = torch.cat([self.rewards[k].group_ids for k in keys])
                a = group_advantages(r, g, std=cfg.adv_std, clip=cfg.adv_clip)
                for k, part in zip(keys, a.split([len(self.rewards[k].rewards) for k in keys])):
                    self.adv[k] = part
            else:  # whole groups per micro-batch: the same numbers as over the whole step
                r = self.rewards[key]
                self.adv[key] = group_advantages(r.rewards, r.group_ids, std=cfg.adv_std, clip=cfg.adv_clip)
        return self.adv[key]

    # -- completions: what each kind's result feeds ----------------------------------------------
    def completed(self, wid: str, unit: Unit, done: Done) -> None:
        STEP_TABLE[type(unit)].done(self, wid, unit, done)

    def _generated(self, wid: str, unit: Generate, done: Generated) -> None:
        """The unit's rows now hold this segment: drop the older shards they cover."""
        shards = self.trajs.setdefault((unit.step, unit.mb), {})
        n = len(self.plans(unit.step).micro_batches[unit.mb].coords)
        first, last = row_range(unit.samples, n)
        for rows in [k for k in shards if row_range(k, n)[0] < last and row_range(k, n)[1] > first]:
            del shards[rows]
        outs = self.out.pop(wid)
        for heads, _, _ in outs:
            shards.update(heads)
        if unit.t_end == self.plans(unit.step).spec.num_steps:  # finished: the reward's media, the latents
            self.media.setdefault((unit.step, unit.mb), {}).update(media for _, media, _ in outs)
            lat = self.latents.setdefault((unit.step, unit.mb), {})
            for _, _, latents in outs:
                lat.update(latents)
        if done.comm:
            self.gen_comm[unit.step] = _add([self.gen_comm.get(unit.step, {}), done.comm])

    def _rewarded(self, wid: str, unit: Reward, done: Rewarded) -> None:
        """A fragment's rewards; once the fragments cover the micro-batch, its groups are
        assembled in row order, whatever order the fragments finished in (the scheduler makes
        its Train units then)."""
        key = (unit.step, unit.mb)
        n = len(self.plans(unit.step).micro_batches[unit.mb].coords)
        frags = self.fragments.setdefault(key, {})
        frags[row_range(unit.samples, n)] = done
        if sum(b - a for a, b in frags) < n:
            return
        del self.fragments[key]
        self.rewards[key] = assemble_rewards([frags[k] for k in sorted(frags)], self.cfg.reward)

    def _trained(self, wid: str, unit: Train, done: Trained) -> None:
        lag = unit.step - unit.traj_version
        self.stale[unit.step] = max(self.stale.get(unit.step, lag), lag)
        self.traj_bytes[unit.step] = self.traj_bytes.get(unit.step, 0) + done.traj_bytes

    def _stepped(self, wid: str, unit: OptimizerStep, done: Stepped) -> None:
        self.opt.setdefault(unit.step, {})[wid] = done
        payload = self.out.pop(wid)
        if wid == self.publisher:
            self.weights[unit.version] = payload
            for v in [v for v in self.weights if v < unit.version - 2]:
                del self.weights[v]  # lag <= 1: nobody pulls older versions

    def _synced(self, wid: str, unit: WeightSync, done: Synced) -> None:
        self.syncs.append(done)

    def inputs_lost(self, wid: str, unit: Unit) -> None:
        """`unit`'s micro-batch is generated again (a node holding its trajectories died):
        its advantages are computed again from the new rewards (its old rewards stay until
        then: whole-step advantages of the other micro-batches may still read them)."""
        self.out.pop(wid, None)
        self.adv.pop((unit.step, unit.mb), None)
        self.fragments.pop((unit.step, unit.mb), None)  # its fragments are generated and scored again

    def replace(self, worker: Worker) -> Worker:
        self.out.pop(worker.id, None)
        return self.actors.replace(worker)

    def kill(self, worker_id: str) -> None:
        """A spot worker past its deadline: its actors die now (the loop sees its unit lost)."""
        gang = self.actors.handles.get(worker_id)
        if gang is not None:
            gang.kill()

    def retire(self, worker: Worker, lost: bool = False) -> None:
        """A drained worker left the pools (or died draining): stop its actors."""
        self.out.pop(worker.id, None)
        self.actors.retire(worker)

    def step_done(self, step: int, now: float, trace: Trace) -> None:
        """RL step `step` finished (all optimizer steps reported): one metrics record.
        `trace`: the run's spans so far, units in flight included (bubble ratios)."""
        cfg, actors = self.cfg, self.actors
        keys = sorted(k for k in self.rewards if k[0] == step)
        rows = [_Rewarded(self.rewards[k].rewards, self.rewards[k].parts) for k in keys]
        infos = self.opt.pop(step)
        m = step_metrics(rows, _combine_learner(infos, actors.train_ids[0]))
        for k in keys:
            self.rewards.pop(k)
            self.adv.pop(k, None)
            self.trajs.pop(k, None)
            self.media.pop(k, None)
            self.latents.pop(k, None)
        real = step + 1  # the step's record is numbered by the optimizer steps done
        step_s = now - self.last_end
        self.wall_s = self.wall0 + now
        pub = infos.get(self.publisher) if self.publisher else None
        bubbles = {p: bubble_ratio(trace, p, self.last_end, now) for p in set(trace.workers.values())}
        record = {
            "step": real, **m, "mode": cfg.run.mode,
            "staleness_max": self.stale.pop(step, 0),
            "bubble_ratio_rollout": bubbles.get("rollout", bubbles.get("colocated", 0.0)),
            "bubble_ratio_trainer": bubbles.get("trainer", bubbles.get("colocated", 0.0)),
            "weight_sync_s": (pub.publish_s if pub else 0.0) + sum(i.end - i.start for i in self.syncs),
            "weight_sync_bytes": sum(i.bytes for i in self.syncs),
            "timing/publish_bytes": pub.publish_bytes if pub else 0,
            "timing/allreduce_s": max(i.reduce_s for i in infos.values()),
            # lean trajectory rows the trainer ranks received (== sim.trajectories.predict_trajectory_bytes)
            "transfer/trajectory_bytes": self.traj_bytes.pop(step, 0),
            "step_s": step_s, "wall_s": self.wall_s, "samples_per_s": m["samples"] / step_s,
            # bytes of each collective the trainer ranks issued since their previous step
            # (trainer ranks), and the rollout gangs' ranks for the step's Generate units
            **_add([i.comm for i in infos.values()] + [self.gen_comm.pop(step, {})]),
        }
        if cfg.run.mode == "colocated" or cfg.run.mode in TAG_MODES:  # trainers generate: their switches
            record.update(_add([i.tag for i in infos.values()]))
        if cfg.runtime.weight_sync == "nccl":  # what the chain delivered to this step's pulls
            record["comm/sync/send_bytes"] = record["weight_sync_bytes"]
            record["comm/sync/send_calls"] = len(self.syncs)
            actors.check_relay()
        self.syncs = []
        self.last_end = now
        eval_ref = None
        if self.recorder.eval_due(real):
            eval_ref = actors.evaluate(real)  # trainer 0's weights are copied before any new unit
        if self.recorder.checkpoint_due(real):
            self.saves.append(actors.trainer0.save(real, self.wall_s))
        self.records.append((record, eval_ref))
        self.flush(block=False)

    def flush(self, block: bool) -> None:
        """Write step records in order, each once its evaluation (if any) is done. `block`: the
        run is over; wait for the evaluations and checkpoint saves, each within
        runtime.stall_timeout_s (as the event loop waits for a unit)."""
        while self.records:
            record, ref = self.records[0]
            if ref is not None:
                if not block and not ray.wait([ref], timeout=0)[0]:
                    return
                what = f"the evaluation after step {record['step']}"
                record.update(within(self.cfg.runtime, "stall", {what: ref}, what)[what])
            self.records.pop(0)
            self.recorder.log(record)  # metrics.jsonl, progress bar, step line
        if block:
            within(self.cfg.runtime, "stall", {f"checkpoint save {i + 1} of {len(self.saves)} (trainer 0)": ref
                                               for i, ref in enumerate(self.saves)}, "checkpoint saves")
        elif self.saves:  # saves done: their errors now, their refs dropped (else one per checkpoint)
            done, self.saves = ray.wait(self.saves, num_returns=len(self.saves), timeout=0)
            ray.get(done)


def assemble_rewards(parts: list[Rewarded], reward_cfg) -> Rewarded:
    """One micro-batch's rewards from its fragments' (in row order): each reward's scores and
    the group ids concatenated, the combined reward recomputed over the whole groups (with
    reward.aggregate=gdpo each reward is standardised within its group, which a fragment
    alone does not hold)."""
    if len(parts) == 1:
        return parts[0]
    group_ids = torch.cat([p.group_ids for p in parts])
    scores = {k: torch.cat([p.parts[k] for p in parts]) for k in parts[0].parts}
    total = combine_rewards({k: scores[k] for k in reward_cfg.weights}, reward_cfg.weights,
                            aggregate=reward_cfg.aggregate, group_ids=group_ids)
    return Rewarded(start=min(p.start for p in parts), end=max(p.end for p in parts), rewards=total,
                    parts=scores, group_ids=group_ids)


class _Rewarded:
    """What `step_metrics` reads of a micro-batch: its rewards (the driver never holds images)."""

    def __init__(self, rewards: torch.Tensor, parts: dict):
        self.rewards, self.reward_parts = rewards, parts


def _combine_learner(infos: dict[str, Stepped], first: str) -> dict[str, float]:
    """Learner metrics of the step over all trainers: sum of weighted sums / sum of weights
    (a _max metric: the trainers' max)."""
    lm = dict(infos[first].metrics)  # grad norm etc.: identical after the all-reduce
    lm.update(step_means(merge_sums([i.sums for i in infos.values()]), sum(i.weight for i in infos.values())))
    lm["train/skipped_units"] = sum(i.sums.get("train/skipped_units", 0.0) for i in infos.values())
    return lm


@dataclass(frozen=True)
class Route:
    """One unit kind's way through a Ray run, in the order it happens (docs/design/step.md, "A
    step, unit by unit"): the scheduler's assign() hands the unit to a worker, `call` starts it on
    the ranks of the worker's gang, each rank runs one of `methods`, the event loop merges the
    ranks' results (runtime/results.merge) and tells the scheduler (Scheduler.complete, which
    runs `event`), and `done` feeds the result to the rest of the step."""

    event: str  # the Scheduler method that takes the unit's completion (sched/scheduler.py)
    call: Callable  # RealBackend: the actor calls that start the unit
    methods: tuple[str, ...]  # the worker methods those calls run (runtime/workers.py)
    done: Callable  # RealBackend: what the unit's result feeds


# The step table: unit kind -> scheduler event -> backend call -> worker method -> what it feeds.
STEP_TABLE: dict[type, Route] = by_kind(
    generate=Route("_on_generated", RealBackend._call_generate,
                   ("RolloutRank.generate", "TrainerRank.generate"),  # each rank its share of the rows
                   # (a rollout worker; a trainer under TAG, or a colocated worker)
                   RealBackend._generated),  # the micro-batch's trajectory shards (ObjectRefs)
    reward=Route("_on_rewarded", RealBackend._call_reward,
                 ("RolloutRank.reward", "TrainerRank.reward", "RewardWorker.reward"),  # on the generating
                 # worker (a colocated one included), or the reward pool
                 RealBackend._rewarded),  # rewards -> advantages when its Train units start
    train=Route("_on_trained", RealBackend._call_train,
                ("TrainerRank.train",),  # every rank of the trainer gang: loss + backward, grads accumulate
                RealBackend._trained),  # staleness (its coordinates: the span's extra, trace.jsonl)
    optimizer=Route("_on_optimizer_step", RealBackend._call_optimizer,
                    ("TrainerRank.optimizer_step",),  # all-reduce, clip, step; the publisher publishes
                    RealBackend._stepped),  # the new version's payload; the step's metrics once all are in
    sync=Route("_on_synced", RealBackend._call_sync,
               ("RolloutRank.load_weights", "RolloutRank.receive_weights"),  # object store, or the relay (nccl)
               RealBackend._synced),  # sync bytes and seconds
)
