"""The run's Ray actors: one gang per scheduler worker, and what starts, replaces and stops them.

    Actors(cfg)
      .start(pools)          a gang per worker of each pool (placement groups for trainers and
                             multi-device gangs, node-aligned: runtime/cluster.py), their
                             process groups, the relay's pair groups
      .nodes()               the Ray node of each rank of each worker
      .gang(wid)             the gang that runs worker `wid`'s units (runtime/gang.py)
      .replace(old)          a fresh gang for a lost rollout / reward worker
      .add_rollout()         one more rollout worker, starting (elastic pools); `admit` once up
      .retire(worker)        stop a worker that left the pools
      .form_relay_chain(ids) weight_sync=nccl: the relay's chain over the rollout workers (start)
      .pull(wid, version)    weight_sync=nccl: rollout worker `wid` loads `version` from its relay client
      .evaluate(step)        held-out evaluation of trainer 0's weights on the evaluation actor
      .shutdown()

The driver (runtime/driver.py) builds it; the backend (runtime/backend.py) and the elastic
pools (runtime/elastic.py) use it, and neither sees the driver.

Every wait here has a deadline: placement runtime.placement_timeout_s (the resources a worker
asks for: runtime/cluster.py), start-up runtime.start_timeout_s (constructors, process groups,
the relay's chain links); past it, WaitTimeout (runtime/waits.py) names the workers late.
"""

from __future__ import annotations

import logging
from dataclasses import replace as dc_replace
from typing import Optional

import ray
from ray.util.placement_group import remove_placement_group

from digenrl.config.schema import Config
from digenrl.runtime.cluster import (GangPlacement, PoolPlacement, actor_options, await_room, fits_now,
                                     network_options)
from digenrl.runtime.gang import Gang
from digenrl.runtime.waits import within
from digenrl.runtime.workers import EvalWorker, RewardWorker, RolloutRank, TrainerRank
from digenrl.sched import Worker

log = logging.getLogger(__name__)

SHUTDOWN_S = 10.0  # at the end of a run (or after a failure): how long ranks get to close

# The actor class of each rank of a worker, by the worker's role (runtime/workers.py): a
# colocated worker is a trainer rank that also generates.
ROLE_CLASS: dict[str, type] = {"rollout": RolloutRank, "trainer": TrainerRank, "colocated": TrainerRank,
                               "reward": RewardWorker}


class Actors:
    """Every Ray actor of one run, by scheduler worker id (see module doc)."""

    def __init__(self, cfg: Config, evaluate: bool = True):
        self.cfg, self.do_eval = cfg, evaluate
        self.handles: dict[str, Gang] = {}  # worker id -> its gang
        self.workers: list[Worker] = []  # every worker started, in order (replaced ones included)
        self.pids: dict[str, int] = {}  # worker id -> its (rank 0) process
        self.rank_pids: dict[str, list[int]] = {}  # worker id -> the process of each gang rank
        self.evaluator = None  # the EvalWorker actor, started at the first evaluation
        self._placements: dict[str, PoolPlacement] = {}  # a pool's role or a gang's worker id -> its group
        self._n_replaced = 0

    # -- who is who -----------------------------------------------------------------------
    def gang(self, wid: str) -> Gang:
        return self.handles[wid]

    def role(self, wid: str) -> str:
        return next(w.role for w in self.workers if w.id == wid)

    @property
    def train_ids(self) -> list[str]:
        return [w.id for w in self.workers if w.role in ("trainer", "colocated")]

    @property
    def trainer0(self) -> Gang:
        """The first trainer gang: it publishes, evaluates, saves and reports the final weights."""
        return self.handles[self.train_ids[0]]

    # -- start -----------------------------------------------------------------------------
    def start(self, pools) -> None:
        """One Gang per scheduler worker: runtime.trainer.gang actors per trainer and
        runtime.rollout.gang per rollout worker, one actor per reward worker. A worker of
        several devices gets its own placement group, on one node wherever a node holds it
        (cluster.GangPlacement); single-device trainers share one packed group (their gradient
        all-reduce). Every pool has room before any worker process starts (a failure costs no
        model load): the groups are placed first, the largest gangs first, then the pools placed
        one by one are probed for the room left (held together, let go before the spawn). A
        rollout gang forms its own process group and runs sequence-parallel (`_init_sp`)."""
        rt = self.cfg.runtime
        pools = [p for p in pools if p.workers]
        opts: dict[str, list[dict]] = {}  # worker id -> its ranks' actor options
        probes = []
        try:
            for p in sorted(pools, key=lambda p: -self._gang(p.role)):
                gang, ids = self._gang(p.role), [f"{p.role}-{i}" for i in range(p.workers)]
                if gang > 1:
                    for wid in ids:
                        pg = self._placements[wid] = GangPlacement(p.resources, gang, f"{p.role} (gang {wid})",
                                                                   rt.placement_timeout_s)
                        opts[wid] = [pg.options(p.resources, r) for r in range(gang)]
                elif p.role in ("trainer", "colocated"):  # the gradient all-reduce: packed on few nodes
                    pg = self._placements[p.role] = PoolPlacement(p.resources, p.workers, p.role,
                                                                  rt.placement_timeout_s)
                    opts.update({wid: [pg.options(p.resources, i)] for i, wid in enumerate(ids)})
                else:  # placed one by one (replaceable)
                    probes.append(await_room(p.resources, p.workers, p.role, rt.placement_timeout_s, keep=True))
                    opts.update({wid: [actor_options(p.resources)] for wid in ids})
        finally:
            for probe in probes:
                if probe is not None:
                    remove_placement_group(probe)
        straddling = [w for w, pg in self._placements.items() if pg.straddles]
        if straddling:
            log.warning("no node holds a whole gang of %s: their collectives cross nodes", ", ".join(straddling))
        for p in pools:
            for i in range(p.workers):
                self._spawn(Worker(f"{p.role}-{i}", p.role), opts[f"{p.role}-{i}"])
        self.rank_pids.update(self._await_ready(list(self.handles)))
        self.pids.update({w: ranks[0] for w, ranks in self.rank_pids.items()})
        for w in self.workers:
            if w.role == "rollout" and rt.rollout.gang > 1:
                self._init_sp(w.id)
        trainers = self.train_ids
        tc = rt.trainer
        if len(trainers) > 1 or tc.shard == "fsdp":
            ranks = [a for w in trainers for a in self.handles[w].ranks]
            addr = self._started({"trainer rank 0 (address)": ranks[0].dist_address.remote()},
                                 "trainer gangs: process group address")["trainer rank 0 (address)"]
            self._started({f"trainer rank {r}": a.init_dist.remote(addr, r, len(ranks), len(trainers), tc.gang)
                           for r, a in enumerate(ranks)}, "trainer gangs: joining their process group")

    def _started(self, named: dict, what: str, hint="") -> dict:
        """within the start-up deadline (runtime.start_timeout_s)."""
        return within(self.cfg.runtime, "start", named, what, hint)

    def _await_ready(self, wids: list[str]) -> dict[str, list[int]]:
        """The process of each rank of workers `wids` once every one is up (constructors done:
        model and rewarder loaded), or WaitTimeout naming the late ones."""
        return self._started({w: self.handles[w].ready() for w in wids},
                             "workers starting (placed; loading model and rewarder)",
                             hint=lambda: f"free now: {ray.available_resources()}")

    def _release(self, wid: str) -> None:
        """Remove the placement group of worker `wid`'s gang, if it has its own."""
        pg = self._placements.pop(wid, None)
        if pg is not None:
            pg.remove()

    def _gang(self, role: str) -> int:
        """Ranks per worker of `role`."""
        rt = self.cfg.runtime
        return {"rollout": rt.rollout.gang, "reward": 1}.get(role, rt.trainer.gang)

    def _spawn(self, worker: Worker, opts: list[dict]) -> None:
        cls = ROLE_CLASS[worker.role]
        opts = [{**o, **network_options(self.cfg.runtime.network_interface)} for o in opts]
        if self.cfg.runtime.weight_sync == "nccl" and cls is TrainerRank:
            actor = ray.remote(concurrency_groups={"relay": 1})(cls)  # the relay's own thread
        else:
            actor = ray.remote(cls)
        self.handles[worker.id] = Gang([actor.options(**o).remote(self.cfg, worker.id, r)
                                        for r, o in enumerate(opts)], cls)
        self.workers.append(worker)

    def _init_sp(self, wid: str) -> None:
        """Rollout gang `wid`'s ranks join their own process group (sequence parallelism)."""
        ranks = self.handles[wid].ranks
        addr = self._started({f"{wid} rank 0 (address)": ranks[0].dist_address.remote()},
                             f"{wid}: sequence-parallel group address")[f"{wid} rank 0 (address)"]
        self._started({f"{wid} rank {r}": a.init_sp.remote(addr, r, len(ranks)) for r, a in enumerate(ranks)},
                      f"{wid}: joining its sequence-parallel group")

    # -- membership ------------------------------------------------------------------------
    def replace(self, old: Worker) -> Worker:
        """A fresh actor for a lost rollout/reward worker; the scheduler syncs its weights."""
        self.handles.pop(old.id).kill()
        self._n_replaced += 1
        new = Worker(f"{old.id.split('#')[0]}#{self._n_replaced}", old.role)
        pool = self.cfg.runtime.reward if old.role == "reward" else self.cfg.runtime.rollout
        gang, timeout_s = self._gang(old.role), self.cfg.runtime.placement_timeout_s
        self._release(old.id)
        # a lost node may have been the only one with room for this pool: say so, not hang
        what = f"{old.role} (replacing lost worker {old.id})"
        if gang > 1:  # node-aligned, as at the start
            pg = self._placements[new.id] = GangPlacement(pool, gang, what, timeout_s, wait_for_nodes=True)
            self._spawn(new, [pg.options(pool, r) for r in range(gang)])
        else:
            await_room(pool, 1, what, timeout_s, wait_for_nodes=True)
            self._spawn(new, [actor_options(pool)])
        self.rank_pids.update(self._await_ready([new.id]))
        self.pids[new.id] = self.rank_pids[new.id][0]
        if old.role == "rollout" and pool.gang > 1:
            self._init_sp(new.id)
        if self.cfg.runtime.weight_sync == "nccl" and new.role == "rollout":
            self.join_relay(new.id)  # it fetches each version from the relay directly
        log.warning("worker %s lost; replaced by %s", old.id, new.id)
        return new

    def add_rollout(self) -> tuple[Worker, list]:
        """Start one more rollout worker's actors (the options `replace` uses); returns it and
        its ranks' ready refs. It joins the scheduler once they resolve (`admit`)."""
        pool = self.cfg.runtime.rollout
        n = sum(1 for w in self.workers if w.role == "rollout" and "#" not in w.id)
        new = Worker(f"rollout-{n}", "rollout")
        self._spawn(new, [actor_options(pool)] * pool.gang)
        return new, self.handles[new.id].ready()

    def admit(self, worker: Worker, pids: list[int]) -> None:
        """`worker`'s actors are up (`pids`, one per rank): its sequence-parallel group and, with
        weight_sync=nccl, its place with the relay (direct fetches); its first WeightSync loads the weights."""
        self.rank_pids[worker.id], self.pids[worker.id] = pids, pids[0]
        if self.cfg.runtime.rollout.gang > 1:
            self._init_sp(worker.id)
        if self.cfg.runtime.weight_sync == "nccl":
            self.join_relay(worker.id)

    def retire(self, worker: Worker) -> None:
        """Stop a worker that left the pools (drained, or cancelled while starting)."""
        h = self.handles.pop(worker.id, None)
        if h is not None:
            h.kill()
        self._release(worker.id)
        self.pids.pop(worker.id, None)
        self.rank_pids.pop(worker.id, None)
        # weight_sync=nccl: its chain links close with its process; its upstream stops forwarding
        # and its downstream fetches directly from then on (runtime/relay.py)

    # -- the weight relay (runtime.weight_sync=nccl) -----------------------------------------
    def _relay(self):
        """The publishing trainer's rank 0, which hosts the relay; its relay calls run on the
        actor's "relay" thread, so a pull never waits for the trainer's units (TCSS)."""
        return self.trainer0.ranks[0]

    def form_relay_chain(self, wids: list[str]) -> None:
        """The relay's chain relay -> wids[0] -> ... -> wids[-1] (at start): every rollout gang's
        rank 0 joins its two links at once; the relay then sends the latest version down it."""
        relay, me = self._relay(), "the relay (trainer 0)"
        addresses = self._started({me: relay.relay_open_chain.options(concurrency_group="relay").remote(wids)},
                                  "laying out the relay's chain")[me]
        accepted = relay.relay_accept_chain.options(concurrency_group="relay").remote()
        self._started({**{w: self.handles[w].relay_connect(addresses[w]) for w in wids}, me: accepted},
                      "forming the relay's chain")

    def join_relay(self, wid: str) -> None:
        """A rollout worker that joins later (a replacement, an elastic add): it fetches each
        version from the relay directly, outside the chain."""
        relay, me = self._relay(), "the relay (trainer 0)"
        address = self._started({me: relay.relay_attach.options(concurrency_group="relay").remote(wid)},
                                f"attaching {wid} to the relay")[me]
        self._started({wid: self.handles[wid].relay_connect(address)}, f"connecting {wid} to the relay")

    def pull(self, wid: str, unit, version: int) -> list:
        """Rollout worker `wid` loads `version` (its relay client has it, or fetches it): the
        worker's result refs."""
        return self.handles[wid].receive_weights(unit, version)

    def check_relay(self) -> None:
        """Log what the relay gave up on since the last check (a receiver lost mid-transfer: its
        downstream fetched directly; the rollout side raises if a version never arrived)."""
        relay = self._relay()
        for line in ray.get(relay.relay_errors.options(concurrency_group="relay").remote(),
                            timeout=self.cfg.runtime.stall_timeout_s):
            log.warning("weight relay: %s", line)

    def nodes(self) -> dict[str, list[str]]:
        """The Ray node id of each rank of each live worker."""
        return self._started({wid: [a.node_id.remote() for a in h.ranks] for wid, h in self.handles.items()},
                             "ranks reporting their node")

    # -- evaluation ------------------------------------------------------------------------
    def _eval_pool(self):
        """What the evaluation actor reserves: a device like those that generate (rollout
        pool; trainer pool when colocated or without rollout workers), but no CPU slot (on a
        CPU it is niced and takes idle cycles only)."""
        rt = self.cfg.runtime
        generating = rt.rollout if self.cfg.run.mode != "colocated" and rt.rollout.workers else rt.trainer
        return dc_replace(generating, num_cpus=0.0)

    def evaluate(self, step: int) -> Optional[ray.ObjectRef]:
        """Held-out evaluation of trainer 0's current weights; returns the ref of its metrics
        (None with evaluate=False). Call it before any unit of the next step is sent: trainer
        0 copies its weights in call order. On the evaluation actor, so training does not
        wait; on trainer 0 itself (training waits) when the cluster has no free device for it."""
        if not self.do_eval:
            return None
        t0 = self.trainer0
        if self.evaluator is None:
            pool = self._eval_pool()
            if not fits_now(pool):  # an actor that cannot be placed would hold back every record
                log.warning("no free device (or resource %s) for the evaluation actor: trainer 0 evaluates "
                            "between steps, and training waits for it", dict(pool.resources) or "")
                self.evaluator = t0
            else:
                self.evaluator = ray.remote(EvalWorker).options(**actor_options(pool)).remote(self.cfg)
        if self.evaluator is t0:
            return t0.evaluate(step)
        return self.evaluator.evaluate.remote(step, t0.eval_weights())

    # -- stop ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Ask every rank to close its rewarder, wait SHUTDOWN_S for all of them together (a rank
        still loading its model would only answer after it), then kill every actor."""
        closing = []
        for h in self.handles.values():
            try:
                closing += h.shutdown()
            except Exception:  # already gone
                pass
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=SHUTDOWN_S, fetch_local=False)
        for h in self.handles.values():
            h.kill()
        if self.evaluator is not None and self.evaluator not in self.handles.values():
            ray.kill(self.evaluator)
        self.evaluator = None
        self.handles.clear()
        for pg in self._placements.values():
            pg.remove()
        self._placements.clear()

