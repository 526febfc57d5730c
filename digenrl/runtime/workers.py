"""Ray actors of the real-compute runtime: one class per role, each actor one rank wrapping single-device code.

    RolloutRank     a rank of a rollout worker (its sequence-parallel gang, or the whole worker):
                    a policy copy: generate / reward / load_weights, or under weight_sync=nccl
                    receive_weights from the relay through the RelayClient it holds
    TrainerRank     a rank of a trainer gang (roles trainer and colocated: a colocated worker is
                    a trainer rank that also generates) holding a lean single-device `Trainer`
                    (policy + Learner; the rewarder only where it scores, `trainer_rewards`;
                    in a gang the policy loaded shard by shard): train / optimizer_step (all-reduce) /
                    TAG generate / evaluate / save / load / publish; under weight_sync=nccl the
                    publisher's rank 0 holds the Relay rollout ranks pull from (relay_* methods)
    RewardWorker    the configured rewarder only (runtime.reward.workers > 0; one rank)
    EvalWorker      held-out evaluation off the critical path (its own policy copy, at low
                    CPU priority), from weights trainer 0 hands it

    _Rank           what every rank of a scheduler worker does: ready / reward / shutdown
    _PolicyRank     a rank that holds a policy (RolloutRank, TrainerRank): generate,
                    load_weights, joining a process group

runtime/actors.py picks the class of a worker's ranks by its role, once (`ROLE_CLASS`).

Every unit method returns a small typed record (`digenrl.runtime.results`) with worker-side
wall times (`start`, `end`: time.time()); the driver waits on that record's ref and passes
the big results (Trajectories, weights) between actors as ObjectRefs.

Composition, not inheritance: the trainer actor holds a `digenrl.train.trainer.Trainer`, so the
distributed run uses the very code the single-device reference runs (single-device first;
distribution wraps it); the weight relay's two ends (runtime/relay.py) are parts the ranks hold.

Conditioned families (edit, image-to-video): no image travels with a unit. A worker that
generates or rewards looks each sample's image up by its coordinates in its own
PromptSource (a pure function of (seed, step, group)) and reads the file: the rows'
image files must be readable on every worker's node (a shared disk).
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import nullcontext
from typing import Any, Optional

import torch

from digenrl.config.schema import Config
from digenrl.learner.comm import CommCounter
from digenrl.rollout import (SampleSpec, Trajectories, advance, assemble, audio_kwargs, expand, finish, media_of,
                             received_bytes, ship_rows, start)
from digenrl.runtime import weight_sync
from digenrl.runtime.cluster import interface_ip
from digenrl.runtime.gang import ALL, FIRST, on_ranks
from digenrl.runtime.results import Generated, Rewarded, Stepped, Synced, Trained
from digenrl.runtime.shards import concat_trajectories, select_rows
from digenrl.runtime.tag_switch import TagSwitch
from digenrl.sched import Generate, OptimizerStep, Reward, Train, WeightSync


def _times(t0: float) -> dict[str, Any]:
    return {"start": t0, "end": time.time(), "pid": os.getpid()}


class _Rank:
    """One rank of a scheduler worker: it reports its pid, scores micro-batches with its
    rewarder (`self.rewarder`, set by the subclass), and closes the rewarder at the end."""

    def __init__(self, cfg: Config, worker_id: str, rank: int = 0):
        torch.set_num_threads(cfg.runtime.worker_threads)
        self.cfg, self.id, self.rank = cfg, worker_id, rank
        self.source = _row_source(cfg)

    @on_ranks(ALL, ALL)  # every rank reports its pid
    def ready(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this rank runs on (Actors.nodes)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    @on_ranks(ALL, ALL)  # a unit: every rank scores its shards (a sequence-parallel group: see backend)
    def reward(self, unit: Reward, *shards: Trajectories) -> Rewarded:
        """Score a micro-batch: its Generate shards (one when unsharded), in row order."""
        return _score(self.rewarder, shards, self.source)

    @on_ranks(ALL, ALL)
    def shutdown(self) -> None:
        self._close_rewarder()

    def _close_rewarder(self) -> None:
        self.rewarder.close()


class RewardWorker(_Rank):
    """The reward pool: scores finished micro-batches (decoded images) only."""

    def __init__(self, cfg: Config, worker_id: str, rank: int = 0):
        from digenrl.train.trainer import build_rewarder

        super().__init__(cfg, worker_id, rank)
        self.rewarder = build_rewarder(cfg)


class _PolicyRank(_Rank):
    """A rank that holds a policy (`self.policy`, set by the subclass): it generates, loads
    published weights, and may join a process group (`_join`)."""

    def __init__(self, cfg: Config, worker_id: str, rank: int = 0):
        super().__init__(cfg, worker_id, rank)
        self.engine = cfg.runtime.weight_sync
        self.version = 0
        self.dist = False
        self.counter = CommCounter()  # bytes of the collectives this rank issues (comm/* metrics)

    # -- units ------------------------------------------------------------------------
    def generate(self, unit: Generate, step: int, version: int, prompts: list[str],
                 coords: list[tuple[int, int, int]], spec: SampleSpec, rows: tuple[int, int],
                 *prev: Trajectories) -> tuple:
        """Denoising steps [t_start, t_end) of the rows `prompts` / `coords` of a micro-batch
        (the unit's, its sample shard's, or in a gang this rank's share); decodes when finished.

        `prev`: for a continuation, the previous segment's shards that cover these rows (maybe
        handed over by another worker or gang), `rows` the rows within their concatenation;
        none for a fresh micro-batch. Every random draw is a function of the sample's
        coordinates, so any split of the rows generates the same samples.

        Returns rollout.sampler.ship_rows' objects: a head per row (conditioning, log-probs), then,
        once finished, one latent per kept step of each row (those its trainers read: a trainer
        rank receives only its rows' latents of its unit's slots; a segment that stops early ships
        lean rows instead); then the decoded media of the rows for the reward (a Trajectories
        without latents), None for a segment that stops early; then the Generated record.
        """
        t0 = time.time()
        if version != self.version:
            raise RuntimeError(f"{self.id}: asked to generate with version {version} but holds "
                               f"{self.version} (scheduler/runtime out of sync)")
        self.policy.module.eval()
        with self.counter.phase("generate"):
            if not prev:
                images = None if self.source is None else _row_images(self.source, coords, self.policy.height,
                                                                      self.policy.width)
                traj = start(self.policy, prompts, coords, spec, step=step, version=version, images=images)
            else:  # the shipped (lean) rows back in the sampler's layout, in buffers we own
                traj = expand(select_rows(concat_trajectories(prev), *rows), spec)
            advance(self.policy, traj, spec, unit.t_end)
            if unit.t_end == spec.num_steps and self._sp_lead:  # (the rest of its sp group: same latents)
                finish(self.policy, traj)
        heads, latents = ship_rows(traj, spec)
        return (*heads, *latents, media_of(traj), Generated(**_times(t0), comm=self._generate_comm()))

    def _generate_comm(self) -> dict:
        """The collectives a Generate unit reports: a rollout rank's (sequence parallelism), per
        unit; a trainer rank's counter is read at its optimizer step instead."""
        return self.counter.take()

    @property
    def _sp_lead(self) -> bool:
        """Rank 0 of its sequence-parallel group (every worker without sequence parallelism)."""
        return self.rank == 0

    @on_ranks(ALL, ALL)  # a unit: every rank loads the payload
    def load_weights(self, unit: Optional[WeightSync], version: int, payload: dict) -> Synced:
        """WeightSync: adopt published weights `version` (between trajectories only)."""
        t0 = time.time()
        nbytes = weight_sync.load(self.engine, self.policy.module, payload)
        self.version = version
        return Synced(**_times(t0), bytes=nbytes)

    # -- process groups ---------------------------------------------------------------------
    def dist_address(self) -> str:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{interface_ip(self.cfg.runtime.network_interface)}:{port}"

    def _join(self, address: str, rank: int, world: int) -> None:
        """This process's default process group: gloo on CPU, NCCL on GPU."""
        import torch.distributed as dist

        backend = "nccl" if self.cfg.model.device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=world)
        self.dist = True

    @on_ranks(ALL, ALL)
    def shutdown(self) -> None:
        super().shutdown()
        if self.dist:
            import torch.distributed as dist

            dist.destroy_process_group()


class RolloutRank(_PolicyRank):
    """A rank of a rollout worker: a policy copy that generates and rewards, and loads each
    version it is synced to. Under weight_sync=nccl rank 0 holds the worker's end of its pair
    group with the relay (`relay_client`); in a sequence-parallel gang it passes each version
    on to the other ranks (`sp_group`, init_sp)."""

    def __init__(self, cfg: Config, worker_id: str, rank: int = 0):
        from digenrl.models import build_policy
        from digenrl.train.trainer import build_rewarder

        super().__init__(cfg, worker_id, rank)
        self.relay_client = None  # weight_sync=nccl: rank 0's RelayClient (relay_connect)
        self.sp_group = None  # a sequence-parallel rollout gang's process group (init_sp)
        self.policy = build_policy(cfg.model, progress=False)
        self.rewarder = build_rewarder(cfg)
        if cfg.runtime.rollout.preemptible:  # a spot worker: SIGTERM is its notice, not an exit
            import ray

            from digenrl.runtime.cloud_notices import register
            from digenrl.runtime.preempt import arm_sigterm, notice_dir

            arm_sigterm(notice_dir(cfg), lambda: self.id, cfg.runtime.rollout.notice_s)
            # its node's watcher (and a preStop hook) writes its notice when the node is reclaimed
            register(notice_dir(cfg), ray.get_runtime_context().get_node_id(), self.id,
                     ray.util.get_node_ip_address())

    @on_ranks(FIRST, FIRST)  # rank 0 joins the relay's chain and broadcasts to the rest
    def relay_connect(self, address) -> None:
        """Join the relay's chain (or, outside it, fetch directly) at `address`
        (TrainerRank.relay_open_chain / relay_attach); a thread receives every version from then on."""
        from digenrl.runtime.relay import RelayClient

        self.relay_client = RelayClient(device=self.cfg.model.device)
        self.relay_client.connect(address)

    @on_ranks(ALL, ALL)  # a unit: rank 0 loads from its relay client, every rank loads
    def receive_weights(self, unit: Optional[WeightSync], version: int) -> Synced:
        """WeightSync under weight_sync=nccl: load `version` in place from the host copy the relay
        client received (bucket by bucket). Synced.bytes: what the client took off the wire since
        its previous load. In a sequence-parallel rollout gang rank 0 loads it, then broadcasts
        it to the others."""
        t0 = time.time()
        nbytes = self.relay_client.load(self.policy.module, version) if self.rank == 0 else 0
        if self.sp_group is not None:
            import torch.distributed as dist

            for value in weight_sync.payload_state(self.engine, self.policy.module).values():
                dist.broadcast(value, src=0, group=self.sp_group)
        self.version = version
        return Synced(**_times(t0), bytes=nbytes)

    def init_sp(self, address: str, rank: int, world: int) -> None:
        """A rank of a sequence-parallel rollout gang (runtime.rollout.gang): join the gang's own
        process group (gloo on CPU, NCCL on GPU) and run every forward of the policy over it
        (digenrl.models.sequence_parallel)."""
        import torch.distributed as dist

        self._join(address, rank, world)
        self.sp_group = dist.group.WORLD
        self.policy.enable_sequence_parallel(self.sp_group, self.counter)


class TrainerRank(_PolicyRank):
    """A rank of a trainer gang, holding a whole single-device `Trainer` (see module doc); the
    roles trainer and colocated (a colocated worker generates with these same methods). Under
    weight_sync=nccl rank 0 holds a `Relay` (runtime/relay.py); the publisher's (trainer 0's)
    puts each version in it, and the relay's own thread sends it down the rollout ranks' chain."""

    def __init__(self, cfg: Config, worker_id: str, rank: int = 0):
        from digenrl.runtime.gang_rank import master_config, trainer_policy
        from digenrl.train.trainer import Trainer

        super().__init__(cfg, worker_id, rank)
        self.gang = None  # digenrl.runtime.gang_rank.GangRank once a trainer joins its gang (init_dist)
        mc = master_config(cfg)
        # a gang rank's policy stays on the meta device until init_dist shards it (sharded_load);
        # the rewarder and the evaluator are built where first used (trainer_rewards)
        self.trainer = Trainer(mc, progress=False, policy=trainer_policy(mc), lean=True)
        if trainer_rewards(cfg):
            self.trainer.rewarder  # noqa: B018 (built now: a load error shows at start, not mid-run)
        self.policy = self.trainer.policy
        self.learner = self.trainer.learner
        # every Generate on a trainer is a TAG switch, counted (and offloading when it must)
        self.switch = TagSwitch(self.learner, cfg.runtime.trainer.tag_offload, counts_switches=rank == 0)
        self.relay = None
        if self.engine == "nccl" and rank == 0:  # only the publisher's (trainer 0's) is used
            from digenrl.runtime.relay import Relay

            self.relay = Relay(device=cfg.model.device, host=interface_ip(cfg.runtime.network_interface))

    @property
    def rewarder(self):
        """The trainer's rewarder, built at its first use unless `trainer_rewards`."""
        return self.trainer.rewarder

    def _close_rewarder(self) -> None:
        self.trainer.close()  # (only if one was built)

    def _generate_comm(self) -> dict:
        return {}  # (TAG) read at the optimizer step, with the training collectives

    def generate(self, *args, **kwargs) -> tuple[Trajectories, Generated]:
        """TAG / colocated generation, with the weights that sample: DiffusionNFT's old policy
        when train.nft_decay > 0 (the same weights `_publish` sends rollout workers), else
        the live ones. Swapped back before any Train unit runs on this actor. The TAG switch
        (runtime/tag_switch.py) enters the helper at the first of consecutive Generates,
        offloading the step's uncommitted state when runtime.trainer.tag_offload says so; the
        next unit that is not a Generate leaves it (`_actor`), restoring it and counting tag/*
        for the next optimizer step."""
        with self.switch.generating(), self.learner.sampling_weights():
            return super().generate(*args, **kwargs)

    @on_ranks(ALL, ALL)  # a unit: every rank loads the payload
    def load_weights(self, unit: Optional[WeightSync], version: int, payload: dict) -> Synced:
        """The initial sync of a fresh run (trainer 0's weights; a resumed run's trainers load
        the checkpoint instead): DiffusionNFT's old policy starts as these weights too."""
        self._actor()
        out = super().load_weights(unit, version, payload)
        if self.learner.old is not None:
            self.learner.old.reset()
        return out

    @property
    def _sp_lead(self) -> bool:
        return self.gang.sp_rank == 0 if self.gang is not None else self.rank == 0

    def _actor(self) -> None:
        """Back from TAG's helper, if this trainer generated last: before anything that trains,
        steps, reads or writes the training state."""
        self.switch.leave()

    # -- units ------------------------------------------------------------------------
    @on_ranks(ALL, ALL)  # a unit: every rank accumulates its rows' gradient
    def train(self, unit: Train, advantages: torch.Tensor, spec: SampleSpec, total_samples: int,
              total_steps: int, mine: tuple[int, int], unit_rows: int, steps: list[list[int]],
              *parts) -> Trained:
        """Accumulate the gradient of one Train unit (micro-batch or sample shard x chunk of
        trained steps). `parts`: the heads of the rows this rank received (a gang rank: its share
        of the unit's rows, `RealBackend._call_train`; DPO: the whole unit), then each row's
        latents at `steps` (rollout.sampler.row_kept of the unit's slots), row by row; `mine`: the
        rows it trains among them; `unit_rows` the unit's row count (a gang's ranks all run the
        passes of the largest share); `advantages`: of the received rows. The learner weights the
        unit by its row count, so shards add up to the whole."""
        self._actor()
        t0 = time.time()
        heads, latents = parts[:len(steps)], parts[len(steps):]
        traj = assemble(heads, steps, latents)
        traj.advantages = advantages
        passes = self.gang.share(unit_rows, len(unit.t_steps))[1] if self.gang is not None else 0
        mine = slice(*mine)
        self.learner.accumulate(traj, list(unit.t_steps), spec, total_samples=total_samples,
                                total_steps=total_steps, rows=mine, passes=passes)
        # the ranks of a sequence-parallel group train the same rows: the first one reports them
        done = [(*c, t) for c in traj.coords[mine] for t in unit.t_steps] if self._sp_lead else []
        return Trained(**_times(t0), trained=done, traj_bytes=received_bytes(heads, latents))

    @on_ranks(ALL, ALL)  # a unit: every rank reduces and steps (collectives)
    def optimizer_step(self, unit: OptimizerStep, version: int, publish: bool) -> tuple[Optional[dict], Stepped]:
        """Reduce the accumulated gradients across trainers, step, and (worker 0) publish.

        Workers that trained nothing contribute zeros; a parameter nobody touched keeps
        grad None on every worker, exactly as on a single device. In a gang every rank
        calls this; rank 0 of the publishing gang returns the payload.
        """
        self._actor()
        t0 = time.time()
        sums, weight = self.learner.accumulated() if self._sp_lead else ({}, 0.0)  # (sp: counted once)
        # across trainers, once per RL step: every trainer, or a gang rank's column of the mesh
        from digenrl.runtime.gang_rank import all_reduce_grads  # (FSDP: loaded by trainers only)

        if self.gang is not None:
            if self.gang.replicas is not None:  # one gang: FSDP's reduce-scatters summed it all
                all_reduce_grads(self.learner.grads, self.gang.replicas, self.counter)
        elif self.dist:
            all_reduce_grads(self.learner.grads, None, self.counter)
        t_reduce = time.time() - t0
        metrics = self.learner.optimizer_step(version=version)
        if self.gang is not None:
            self.gang.after_step()
        self.version = version  # = unit.version (units carry the run's versions)
        payload, nbytes, t_pub = None, 0, 0.0
        if publish:
            t1 = time.time()
            # nccl: rollout workers receive it from the relay, never the object store
            payload, nbytes = self._publish(payload=self.engine != "nccl")
            t_pub = time.time() - t1
        comm = self.counter.take()
        return payload, Stepped(**_times(t0), metrics=metrics, sums=sums, weight=weight, reduce_s=t_reduce,
                                publish_s=t_pub, publish_bytes=nbytes, comm=comm, tag=self.switch.take())

    def _publish(self, payload: bool = True) -> tuple[Optional[dict], int]:
        """The weights rollout workers pull (rank 0's; a gang gathers them first): the ones that
        sample, DiffusionNFT's old policy when train.nft_decay > 0. With weight_sync=nccl they
        go to this rank's relay instead, which sends them down the rollout ranks' chain (relay_*
        methods): the optimizer step then puts nothing in the object store (`payload` False); a
        single trainer hands the relay its live tensors (copied to pinned host memory on the
        relay's stream), a gang's rank 0 copies each gathered tensor straight into the relay's
        pinned buckets."""
        with self.learner.sampling_weights():
            if self.relay is not None and not payload:
                live = weight_sync.payload_state(self.engine, self.policy.module)
                if self.gang is None:
                    return None, self.relay.put(self.version, live)
                from digenrl.runtime.gang_rank import _DTYPES
                from digenrl.runtime.relay import unpack

                packed = self.relay.reserve(self.version, live, _DTYPES[self.cfg.model.dtype])
                self.gang.gather_payload(self.engine, self.cfg.model.dtype, into=unpack(packed.header, packed.buckets))
                return None, self.relay.commit(packed)
            if self.gang is None:
                state, nbytes = weight_sync.publish(self.engine, self.policy.module)
            else:  # only rank 0 copies the gathered tensors to the host
                state = self.gang.gather_payload(self.engine, self.cfg.model.dtype)
        if self.gang is not None:
            if self.rank != 0:
                return None, 0
            nbytes = sum(v.numel() * v.element_size() for v in state.values())
        if self.relay is not None:
            self.relay.put(self.version, state)
        return state, nbytes

    # -- the weight relay (weight_sync=nccl; the publisher's rank 0, on its "relay" thread) ------
    def relay_open_chain(self, peers: list[str]) -> dict:
        return self.relay.open_chain(peers)

    def relay_accept_chain(self) -> None:
        self.relay.accept_chain()

    def relay_attach(self, peer: str):
        return self.relay.attach(peer)

    def relay_errors(self) -> list[str]:
        """What the relay gave up on since the last call (a receiver lost, a direct fetch never joined)."""
        out, self.relay.errors = self.relay.errors, []
        return out

    # -- services of trainer 0 (and every rank's part of them) ----------------------------------
    @on_ranks(ALL, FIRST)  # every rank generates (a sharded gang's forwards are collectives)
    def evaluate(self, step: int) -> dict:
        """Held-out evaluation in place (only when no device is free for an EvalWorker); every
        rank of a gang evaluates (FSDP forwards), rank 0 writes the sample grid."""
        self._actor()
        return self.trainer.evaluate(step, save_images=self.rank == 0)

    @on_ranks(ALL, FIRST)  # every rank gathers (collectives); rank 0's copy
    def eval_weights(self) -> dict:
        """The trainable tensors to evaluate: EMA-averaged when train.ema_decay > 0 (gathered
        in a gang: every rank calls it)."""
        from digenrl.learner.sharded import full_state_dict

        self._actor()
        ema = self.learner.ema
        with ema.applied() if ema is not None else nullcontext():
            return full_state_dict(self.policy.module)

    @on_ranks(ALL, FIRST)  # every rank gathers (collectives); rank 0's payload
    def publish(self) -> Optional[dict]:
        """The current weights as a payload (initial sync of other trainers, resume; and in the
        relay under nccl); a collective in a gang. Start-up traffic, not a step's: a gang's
        counter drops it."""
        self._actor()
        payload = self._publish()[0]
        self.counter.take()
        return payload

    def init_dist(self, address: str, rank: int, world: int, gangs: int = 1, gang: int = 1) -> None:
        """Join the trainers' world (gloo on CPU, NCCL on GPU). With shard=fsdp this rank
        becomes rank `rank % gang` of gang `rank // gang` (runtime/gang_rank.py): the module
        is sharded over the gang and the Learner rebuilt on the sharded parameters."""
        self._join(address, rank, world)
        if self.cfg.runtime.trainer.shard == "fsdp":
            from digenrl.runtime.gang_rank import GangRank

            self.gang = GangRank(self.cfg, self.trainer, rank, gangs, gang, self.counter)
            self.learner = self.switch.learner = self.trainer.learner

    @on_ranks(ALL, FIRST)  # every rank writes its shard (collectives); rank 0's path
    def save(self, step: int, wall_s: float) -> str:
        """Trainer 0's checkpoint: its own files, or in a gang the sharded layout (`dcp/`)
        that every rank of the gang writes its shards of (a collective)."""
        self._actor()
        self.trainer.step, self.trainer.wall_s = step, wall_s
        if self.gang is None:
            return str(self.trainer.save())
        from digenrl.io import checkpoint as ckpt

        t = self.trainer
        return str(ckpt.save_sharded_checkpoint(
            t.run_dir, step, module=self.policy.module, optimizer=self.learner.optimizer, ema=self.learner.ema,
            state=t.checkpoint_state(), keep=self.cfg.run.keep_checkpoints, group=self.gang.group,
            old=self.learner.old))

    @on_ranks(ALL, ALL)  # every rank reads its shard; each returns the step
    def load(self, path: str) -> int:
        """Every trainer (every rank of every gang): resume from a checkpoint; a sharded one
        loads into any gang size (resharded)."""
        from pathlib import Path

        self.trainer.load(Path(path), self.gang.group if self.gang is not None else None)
        self.version = self.trainer.step
        return self.trainer.step

    @on_ranks(ALL, FIRST)  # every rank gathers (collectives); rank 0's state
    def final_state(self) -> tuple[dict, Optional[dict]]:
        """Full trainable tensors and EMA shadows (gathered in a gang: every rank calls it)."""
        from digenrl.learner.sharded import full_state_dict

        ema = self.learner.ema
        shadows = None
        if ema is not None:
            with ema.applied():
                shadows = full_state_dict(self.policy.module)
        return full_state_dict(self.policy.module), shadows


class EvalWorker:
    """Evaluates held-out prompts on its own copy of the policy, so that neither pool stops
    for it. Niced: on a shared CPU it takes the cycles the pools leave idle."""

    def __init__(self, cfg: Config, worker_id: str = "eval-0"):
        from digenrl.train.evaluation import Evaluator
        from digenrl.models import build_policy
        from digenrl.train.trainer import build_rewarder

        os.nice(10)
        torch.set_num_threads(cfg.runtime.worker_threads)
        self.policy = build_policy(cfg.model, progress=False)
        self.rewarder = build_rewarder(cfg)
        self.evaluator = Evaluator(cfg, self.policy, self.rewarder)

    def ready(self) -> int:
        return os.getpid()

    def evaluate(self, step: int, weights: dict) -> dict:
        """Load trainer 0's trainable tensors of RL step `step`, evaluate, write the sample grid."""
        from digenrl.models.lora import load_trainable_state_dict

        load_trainable_state_dict(self.policy.module, weights)
        return self.evaluator.evaluate(step)

    def shutdown(self) -> None:
        self.rewarder.close()


def trainer_rewards(cfg: Config) -> bool:
    """Whether trainer ranks score rewards from the start: they generate (colocated, or TAG) and
    no reward pool takes the Reward units. Otherwise a trainer rank builds its rewarder only if
    asked to score (a lost rollout worker's re-queued Reward without a reward pool) or to
    evaluate (trainer 0, when no device is free for the evaluation actor)."""
    from digenrl.config.contract import contract

    if cfg.runtime.reward.workers > 0:
        return False
    sched = contract(cfg).sched
    return sched.colocated or bool(sched.tag)


def _row_source(cfg: Config):
    """The data rows of a conditioned family (None otherwise): each sample's image by coordinates."""
    from digenrl.models.families import has

    if not has(cfg.model.name, "conditioning"):
        return None
    from digenrl.train.trainer import prompt_source

    return prompt_source(cfg)


def _row_images(source, coords, height: int, width: int) -> torch.Tensor:
    """(B, 3, height, width) in [0, 1]: the image of each sample's row, (step, group) -> row."""
    from digenrl.data import load_images

    return load_images([source.image(step, group) for step, group, _ in coords], height, width)


def _score(rewarder, shards: tuple[Trajectories, ...], source=None) -> Rewarded:
    """Reward a micro-batch from its Generate shards (one when unsharded), in row order;
    with `source` (conditioned families), rewards that want them see the rows' images."""
    t0 = time.time()
    traj = concat_trajectories(shards)
    sources = None if source is None else _row_images(source, traj.coords, *traj.images.shape[-2:])
    rewards, parts = rewarder.score(traj.images, traj.prompts, traj.group_ids, sources, **audio_kwargs(traj))
    return Rewarded(**_times(t0), rewards=rewards, parts=parts, group_ids=traj.group_ids)

