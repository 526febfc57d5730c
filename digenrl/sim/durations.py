"""Scheduler units -> cost-model seconds, on each worker's own device.

    Testbed (pools, model, workload) + RunContract --layout--> contract workers on GPUs
                                                   --make_duration_fn--> duration_fn(worker, unit) -> s

What each unit costs (B = samples in the unit = len(unit.groups) * samples per group, or
the size of its sample shard, unit.samples = [first, last), when the scheduler shards):

    Generate       (t_end - t_start) denoising steps of B samples, in forwards of
                   `rollout_batch` samples (the last forward may be smaller); CFG doubles each
                   forward. t_start == 0 also encodes the unit's prompts (text encoder): one pass per
                   prompt group the shard touches.
    Reward         VAE decode + reward-model forward of B samples, on the worker that runs it.
    Train          len(t_steps) training steps (forward + backward) of B samples in
                   micro-batches of `micro_batch`; grad checkpointing, LoRA, train CFG. A
                   trainer gang of N GPUs splits the B rows over its ranks (rank 0: ceil(B/N)).
    OptimizerStep  the gradient reduction (gangs: fp32 local shards all-reduced across gangs;
                   see _grad_reduce_s) + fused AdamW on this rank's shard of the trainable
                   parameters (+ offload) + publishing the new weights (disaggregated modes
                   only, see _publish_s).
    WeightSync     the receiving rollout worker's side of a sync over links.inter_pool:
                   nccl = the relay's chain delivering the version (trainer 0's NIC sends it
                   once, each receiver forwards it) + the host->device load; object-store /
                   lora-only = the network hops and
                   the host->device copy (the sender's device->host + object-store copy is in
                   OptimizerStep).

Trajectory rows (our runtime: the disaggregated modes and run.mode=colocated; see _traj_setup):
a Generate ships its rows' kept latents and log-probs (math.payload: the bytes the runtime's
counter counts) into its object store, a resumed segment first pulls the rows it resumes, and a
Train unit waits while each rank of its gang pulls its share (collectives.object_store_pull_s);
`traj_bytes` sums what the ranks pull per RL step (= transfer/trajectory_bytes).

Gangs (runtime.trainer.gang/reshard; the bytes are sim.gangs', the runtime's counters'):
a trainer worker is a gang of N GPUs that runs each unit SPMD. Its FSDP collectives, ring
all-gathers and reduce-scatters over the gang's link (intra-node when it fits in a node),
are charged to the unit that issues them, minus what FSDP's prefetch hides behind compute:

    Train          reshard after-forward: every forward and every backward gathers every
                   unit, every backward reduce-scatters; after-step: the first forward after
                   a reshard gathers once, backward still reduce-scatters
    Generate       TAG on a gang: every rank generates the unit whole; gathers as for Train
    OptimizerStep  the publisher's gather (every unit once) before the relay sends

Sequence-parallel gangs (runtime.rollout.gang, runtime.trainer.sp; sim.sp, video models): a
rollout worker of P GPUs runs each Generate whole, every rank a forward at its share of the
FLOPs (fixed costs whole) plus the Ulysses all-to-alls and gathers on the gang's link, exposed;
it decodes and scores on rank 0 (the others wait). A trainer gang of G with sp = P shares a
unit's rows over G / P data groups, each group's P ranks computing its rows that way (Train:
forward + backward + recompute, the KL forward; TAG Generate alike).

Colocated baselines (docs/design/simulator.md section 4) pay extra costs where they physically happen:

    per-forward FSDP all-gather   every Generate forward, when the rollout samples with an
                                  FSDP-sharded module and the gather is not hidden by compute
    optimizer-state offload       OptimizerStep (to host, before generation) ...
    ... and reload                the worker's first Train unit of the step (back to GPU)
    phase switch                  OptimizerStep (train -> generate toggles; for veRL's hybrid
                                  engine also the all-gather that rebuilds the rollout copy)
    recomputed old log-probs      every Train unit: one no-grad forward per trained step
                                  (veRL-Omni style only; flow_grpo / GenRL keep the sampler's)

The peers as they ship (style = a shipped.SYSTEMS name) pay their own mechanisms, priced by
shipped.py's rules: CFG as two calls, sampling through FSDP, text encoding per sample, serial
VAE decode, recomputed log-probs in their log-prob micro-batch, and once per step (OptimizerStep)
the rollout copy's sleep/wake, its weight gather, parameter and optimizer offload, reward-model
moves and the extra optimizer steps; genrl's accumulation (no_sync) reduce-scatters once per
optimizer step instead of after every backward.

Every mode pays a no-grad reference forward per trained step when the testbed has `kl` (the
KL term needs the reference policy's mean); it is useful work, in the ideal bound too.

Synchronous rewards need no extra term: in colocated mode the scheduler scores each
micro-batch on the GPU that generated it, between generations, so the reward is on the
critical path exactly as in flow_grpo / GenRL. Every extra second is also added to
`DurationFn.overhead_ws` so reports can show the baseline costs on their own.
"""

from __future__ import annotations

import functools
from itertools import repeat
from dataclasses import dataclass, field

from digenrl.config.contract import RunContract
from digenrl.sched import TAG_MODES, Generate, OptimizerStep, Reward, Train, WeightSync, Worker, by_kind
from digenrl.sim.baselines import IDEAL, RUNTIME, STYLES, style_plan
from digenrl.sim.catalogue import BYTES_GRAD, BYTES_WEIGHT, GIB, get_judge, latent_values, trainable_params_B
from digenrl.sim.collectives import (allgather_traffic, alltoall_traffic, allreduce_s, object_store_pull_s,
                                     object_store_send_s, pcie_s)
from digenrl.sim.devices import get_device
from digenrl.math.kinds import grad_sum_bytes
from digenrl.math.payload import expected_kept, kept_steps, row_bytes, train_rows
from digenrl.sim.tag_switch import SwitchLedger, must_offload, reload_bytes, switch_bytes
from digenrl.sim.costs import PHASE_SWITCH_FIXED_S, CostModel, JudgeServing
from digenrl.sim.gangs import GangComm, catalogue_layout
from digenrl.sim.shipped import SYSTEMS, System, shard_group, step_costs
from digenrl.sim.sp import SpDims, forward_bytes, image_tokens_for
from digenrl.sim.shipped import fit as shipped_fit
from digenrl.sim.testbed import Testbed


@dataclass(frozen=True)
class Layout:
    """Which worker sits on which GPU of the testbed, for one mode."""

    workers: tuple[Worker, ...]
    device: dict  # worker id -> device name
    pool: dict  # worker id -> testbed Pool
    gpus: dict = field(default_factory=dict)  # worker id -> GPUs it holds (a trainer gang's size)

    def ids(self, role: str) -> list[str]:
        return [w.id for w in self.workers if w.role == role]

    @functools.cached_property
    def trainer_ids(self) -> frozenset:
        return frozenset(self.ids("trainer"))

    @functools.cached_property
    def weights(self) -> dict:
        """worker id -> (GPUs, device, role): how report.measure weighs its spans. Workers alike
        share one tuple."""
        alike: dict = {}
        return {w.id: alike.setdefault(k, k) for w in self.workers
                for k in [(self.gpus.get(w.id, 1), self.device.get(w.id), w.role)]}

    @property
    def n_gpus(self) -> int:
        return sum(self.gpus.get(w.id, 1) for w in self.workers)


_LAYOUTS: dict = {}  # layout()'s memo: what it reads of (tb, run) -> Layout


def layout(tb: Testbed, run: RunContract) -> Layout:
    """The contract's workers placed on `tb`'s GPUs (memoised on what it reads: the planner
    asks for thousands of points, a few layouts, each of thousands of workers at scale).

    Pools with role `any` are one pool to split: colocated workers take every GPU; otherwise
    rollout workers take the first GPUs and trainers the rest, packed at the end so that
    they fill whole nodes first. Pools with fixed roles (heterogeneous presets) hold the
    workers of their role, in order. Counts must match (`digenrl.sim.workload.testbed_for`
    sizes the testbed to the config).
    """
    gang = run.pool("trainer").resources.gang if run.pool("trainer") else 1
    rgang = run.pool("rollout").resources.gang if run.pool("rollout") else 1
    key = (tb.name, tb.pools, tuple((p.role, p.workers) for p in run.pools), gang, rgang)
    lay = _LAYOUTS.get(key)
    if lay is None:
        if len(_LAYOUTS) >= 4096:
            _LAYOUTS.clear()
        lay = _LAYOUTS[key] = _layout(tb, run, gang, rgang)
    return lay


def _layout(tb: Testbed, run: RunContract, gang: int, rgang: int) -> Layout:
    gpus = [(p, i) for p in tb.pools for i in range(p.count)]
    every = run.workers()
    workers = [w for w in every if w.role != "reward"]
    if len(workers) < len(every):
        raise ValueError("runtime.reward.workers: the simulator models rewards on the generating worker; set 0")
    # a trainer gang holds `gang` GPUs, a rollout gang (sequence parallel) `rgang`
    size = {w.id: gang if w.role == "trainer" else rgang if w.role == "rollout" else 1 for w in workers}
    if tb.split_pool:
        order = {"colocated": 0, "rollout": 0, "trainer": 1}
        places, i = {}, 0
        for w in sorted(workers, key=lambda w: order[w.role]):
            places[w.id] = gpus[min(i, len(gpus) - 1)]  # a gang's first GPU (its pool and device)
            i += size[w.id]
        if i != len(gpus):
            raise ValueError(f"{len(workers)} workers ({i} GPUs) on {tb.name} ({len(gpus)} GPUs): sizes differ")
    else:
        if any(w.role == "colocated" for w in workers):
            raise ValueError(f"testbed {tb.name!r} has fixed rollout/trainer pools; mode 'colocated' "
                             "needs pools with role 'any' (use simulate.homogeneous_reference)")
        places = {}
        for role in ("rollout", "trainer"):
            mine = [w for w in workers if w.role == role]
            slots = [(p, i) for p in tb.pool(role) for i in range(p.count)]
            per = gang if role == "trainer" else rgang
            if len(mine) * per != len(slots):
                raise ValueError(f"{len(mine)} {role} workers x {per} GPUs but testbed {tb.name!r} fixes {len(slots)}")
            places.update({w.id: slots[j * per] for j, w in enumerate(mine)})
    return Layout(tuple(workers), {w: p.device for w, (p, _) in places.items()},
                  {w: p for w, (p, _) in places.items()}, size)


@dataclass
class DurationFn:
    """duration_fn(worker, unit) -> seconds, plus the bookkeeping reports need.

    samples_per_group: samples behind one scheduler "group". DigenRL modes use whole prompt
    groups (GAP needs every reward of a group for its advantages); batch-level baselines may
    cut a prompt group into shards, as flow_grpo spreads a group's samples over GPUs.
    """

    tb: Testbed
    cm: CostModel
    mode: str
    layout: Layout
    samples_per_group: int
    style: str | None = None  # colocated style: colocated-ideal or a shipped system (shipped.SYSTEMS)
    zero_baseline: bool = False  # measure a baseline with its extra costs removed
    colocated_config: str | None = None
    gang: int = 1  # GPUs per trainer gang (runtime.trainer.gang)
    after_step: bool = False  # runtime.trainer.reshard == after-step
    offload: bool = False  # runtime.trainer.offload: AdamW state on the host
    rollout_gang: int = 1  # runtime.rollout.gang: a rollout worker's sequence-parallel degree (sim.sp)
    trainer_sp: int = 1  # runtime.trainer.sp: sequence-parallel degree inside a trainer gang
    memory: str | None = None  # colocated-ideal: the memory plan (baselines.layouts; None: the cheapest that fits)
    check_memory: bool = True  # False: simulate a shipped peer's published recipe even where memory.py says it
    #                            does not fit (the recipe ran; the model's activations are an extrapolation)
    overhead_ws: dict = field(default_factory=dict)  # baseline cost name -> worker-seconds
    _per_fwd: float = 0.0
    _per_step: dict = field(default_factory=dict)
    _recompute: bool = False
    _reloaded: set = field(default_factory=set)
    _gathered: dict = field(default_factory=dict)  # worker id -> after-step params gathered since its reshard
    system: System | None = None  # a shipped peer's mechanisms (colocated only; None: ours or colocated-ideal)
    memo: bool = True  # replay the cost of a unit already priced (__call__)
    _no_sync: bool = False  # colocated layout accumulating under no_sync (baselines.Layout.no_sync)
    pairs_per_pass: int = 0  # train.pairs_per_pass: TSP's packed passes (0: one pass per trained step)
    tag: bool = False  # the mode's trainers generate (TAG): their switches are charged
    tag_ledger: SwitchLedger = field(default_factory=SwitchLedger)  # TAG: which units switch, bytes moved
    _units: dict = field(default_factory=dict)  # unit key -> (seconds, overhead increments, gathered after)
    # the first RL step's trained steps (SchedConfig.trained; (): the first tb.trained_steps), what a
    # finished row ships in every step (a pure value: emulated actors draw no window, tests/sim/test_torch_free)
    window: tuple = ()
    traj_bytes: dict = field(default_factory=dict)  # step -> trajectory bytes its Train units' ranks pulled
    _log: list | None = None  # overhead increments of the unit being priced

    def __post_init__(self):
        tb = self.tb
        self.n_trainers = sum(w.role in ("trainer", "colocated") for w in self.layout.workers)  # gangs
        self.n_rollout = sum(w.role == "rollout" for w in self.layout.workers)
        self.trainable_B = trainable_params_B(tb.model, tb.lora, tb.lora_rank)
        self.trainer_pool = next(self.layout.pool[w.id] for w in self.layout.workers
                                 if w.role in ("trainer", "colocated"))
        self.trainer_device = self.trainer_pool.device
        self.fsdp = catalogue_layout(tb.model, tb.lora, tb.lora_rank, BYTES_WEIGHT)  # bf16 gathers
        self._cache: dict = {}
        fit = self.cm.fits(tb.model, ["trainer"], self.trainer_device, train_batch=self.pairs_per_pass or tb.micro_batch,
                           lora=tb.lora, grad_ckpt=tb.grad_ckpt, cfg=tb.train_cfg, shape=tb.shape,
                           lora_rank=tb.lora_rank, fsdp_shards=self.gang, after_step=self.after_step,
                           offload=self.offload, gang=self.gang > 1, sp=self.trainer_sp)
        self._sp_setup()
        self._traj_setup()
        self.tag = self.mode in TAG_MODES
        if self.tag:
            self._tag_setup()
        if self.mode == "colocated":
            # zero_baseline on a shipped system: its mechanisms and its sharding removed, i.e. the
            # colocated-ideal row's memory plan with that row's extra costs zeroed as well
            self.system = None if self.zero_baseline else SYSTEMS.get(self.style)
            if self.system is not None:  # a peer as it ships: its own sharding and mechanisms
                self._shipped_costs()
            else:  # the baseline's own memory plan (baselines.style_plan) says how it shards
                self._colocated_costs()
            self.comm = GangComm(self.fsdp, self.col_shards, 1, False, self._bb, tb.kl and tb.lora,
                                 old_forward=tb.old_forward, pairs_per_pass=self.pairs_per_pass,
                                 defer=self.system is None)
            self.gang_link = tb.link(self.trainer_pool, self.col_shards)
        else:
            if not fit.fits:
                raise ValueError(
                    f"{tb.name}: a trainer gang of {self.gang} {self.trainer_device} does not hold the {tb.model} "
                    f"training state ({fit.peak_gib:.0f} GiB per GPU of {fit.usable_gib:.0f} usable): raise "
                    "runtime.trainer.gang (FSDP over more GPUs) or set runtime.trainer.offload")
            self.opt_shards = self.gang
            self.comm = GangComm(self.fsdp, self.gang, self.n_trainers, self.after_step, self._bb,
                                 tb.kl and tb.lora, self.trainer_sp,
                                 tb.weight_sync == "lora-only" or (tb.weight_sync == "nccl" and tb.lora),
                                 old_forward=tb.old_forward, pairs_per_pass=self.pairs_per_pass)
            self.gang_link = tb.gang_link(self.trainer_pool, self.gang, self.n_trainers)

    # ---- colocated baseline costs --------------------------------------------
    def _colocated_costs(self) -> None:
        tb, p = self.tb, self.trainer_pool
        # a shipped system zeroed (the decomposition's factor a): colocated-ideal's best layout, since
        # the peer's layout (FSDP over every GPU across nodes, a sleeping copy) is one of its avoidable costs
        memory = self.memory
        style = self.style if self.style in STYLES else IDEAL  # (a shipped system zeroed: IDEAL)
        plan = style_plan(self.cm, style, tb.model, p.device, self.n_trainers, memory=memory,
                          gpus_per_node=p.gpus_per_node, intra=p.intra_link or tb.links.intra_node,
                          inter=p.inter_link or tb.links.inter_node, gen_batch=tb.rollout_batch,
                          train_batch=tb.micro_batch, lora=tb.lora, lora_rank=tb.lora_rank, grad_ckpt=tb.grad_ckpt,
                          cfg=tb.cfg, train_cfg=tb.train_cfg, shape=tb.shape, kl=tb.kl, reward=tb.reward,
                          denoise_steps=tb.denoise_steps)
        if not plan["fits"]:
            rep = plan["report"]
            raise ValueError(f"{tb.name}: no colocated memory plan fits on {self.n_trainers} {p.device}"
                             + (f" ({memory})" if memory else "")
                             + f": the nearest, {plan['layout'].name}, holds {rep.peak_gib:.0f} GiB per GPU of "
                             f"{rep.usable_gib:.0f} usable")
        self.colocated_config = plan["config"]
        lay = plan["layout"]
        # FSDP shard group of the baseline's trainer: none (replicated, zero2), a node, or every GPU
        self.col_shards = lay.shards(self.n_trainers, p.gpus_per_node) if lay.shard == "fsdp" else 1
        self.opt_shards = lay.shards(self.n_trainers, p.gpus_per_node)
        self._no_sync = lay.no_sync and self.col_shards > 1
        self._recompute = plan["recompute_logp"]
        if self.zero_baseline:
            self._per_fwd, self._per_step, self._recompute = 0.0, {}, False
        else:
            self._per_fwd = float(plan["per_forward_s"])
            self._per_step = {k: float(v) for k, v in plan["per_step_s"].items() if float(v) > 0}

    def _shipped_costs(self) -> None:
        """A shipped system's shard group and once-per-step costs (shipped.step_costs), on the one
        memory rule (shipped.fit): a layout that does not fit is refused with the figure."""
        tb, p, sy = self.tb, self.trainer_pool, self.system
        self.col_shards = shard_group(sy, self.n_trainers)
        self.opt_shards = self.col_shards
        self.colocated_config = f"{sy.name}: " + {"world": "FSDP over all GPUs", "zero2": "ZeRO-2",
                                                  "replicated": "replicated"}[sy.shard]
        ok, peak, usable = shipped_fit(self.cm, sy, tb, p.device, self.n_trainers)
        if not ok:
            if self.check_memory:
                from digenrl.sim.shipped import layout_of

                raise ValueError(f"{tb.name}: {sy.name} as shipped ({layout_of(sy).name}) does not fit on "
                                 f"{self.n_trainers} {p.device}: {peak:.0f} GiB per GPU of {usable:.0f} usable")
            self.colocated_config += f" (modelled peak {peak:.0f} GiB > {usable:.0f} usable)"
        link = tb.link(p, self.n_trainers)
        self._per_step = {"phase_switch": PHASE_SWITCH_FIXED_S,
                          **step_costs(self.cm, sy, tb, p.device, self.n_trainers, link)}
        self._recompute = sy.recompute_logp

    def _overhead(self, name: str, s: float, gpus: int = 1) -> float:
        """Record s seconds of `name` paid by a worker of `gpus` GPUs; returns s."""
        if s:
            self.overhead_ws[name] = self.overhead_ws.get(name, 0.0) + s * gpus
            if self._log is not None:
                self._log.append((name, s * gpus))
        return s

    # ---- TAG's switches (the RFC: "each switch, Actor to helper to Actor, is counted") ----
    def _tag_setup(self) -> None:
        """What one switch moves (sim/tag_switch.py, the runtime counter's own formula). A trainer
        that generates holds its training state beside the generation; where the two do not fit
        one GPU together (sim/memory.py's rule, runtime.trainer.tag_offload=auto), a switch made
        with an accumulated gradient offloads the gradient, its sums, the AdamW state and an
        unsharded full fine-tune's masters to the host and restores them after, over PCIe;
        else it costs only its mode toggles (PHASE_SWITCH_FIXED_S, the colocated baselines')."""
        tb = self.tb
        kw = dict(lora=tb.lora, grad_ckpt=tb.grad_ckpt, cfg=tb.train_cfg, shape=tb.shape, lora_rank=tb.lora_rank,
                  fsdp_shards=self.gang, gang=self.gang > 1, sp=self.trainer_sp)
        train = self.cm.memory_gib(tb.model, "trainer", self.trainer_device, batch=self.pairs_per_pass or tb.micro_batch,
                                   after_step=self.after_step, offload=self.offload, **kw)
        gen = self.cm.memory_gib(tb.model, "rollout", self.trainer_device, batch=tb.rollout_batch,
                                 **{k: v for k, v in kw.items() if k not in ("fsdp_shards", "gang", "lora_rank")})
        offload = must_offload("auto", accumulated=True, on_gpu=True,
                               resident_bytes=int((train.weights + train.grads + train.optimizer) * GIB),
                               generation_bytes=int(gen.activations * GIB),
                               device_bytes=int(get_device(self.trainer_device).hbm_gib * GIB))
        trainable = int(self.trainable_B * 1e9 / max(self.gang, 1))  # this rank's elements
        sums = grad_sum_bytes("auto", int(self.trainable_B * 1e9))
        # (offload one way, generation-copy reload) bytes per rank
        if offload and not self.offload:  # runtime.trainer.offload keeps the optimizer on the host anyway
            self.tag_ledger = SwitchLedger(
                switch_bytes(trainable=trainable, master_bytes=4, optimizer_elements=2 * trainable,
                             grad_sum_bytes=sums, full_ft=not tb.lora, sharded=self.gang > 1),
                reload_bytes(trainable=trainable, generation_bytes=BYTES_WEIGHT, full_ft=not tb.lora,
                             sharded=self.gang > 1))

    @property
    def tag_switches(self) -> int:
        """Actor -> helper -> Actor round trips charged (TAG, the RFC's switches)."""
        return self.tag_ledger.switches

    def _tag_switch(self, worker: Worker, unit) -> float:
        """A trainer's switch into the helper (its first Generate after training), or back (its
        first Train or OptimizerStep after generating, sim/tag_switch.SwitchLedger): the toggle,
        and the offload or reload `_tag_setup` found necessary (the gradient only when the step
        accumulated one)."""
        if self.mode == "colocated" or worker.role != "trainer":
            return 0.0
        edge = self.tag_ledger.unit(worker.id, unit)
        if edge is None:
            return 0.0
        kind_, moved, reload = edge
        s = PHASE_SWITCH_FIXED_S / 2 + (pcie_s(moved + reload, self.trainer_device) if moved else 0.0)
        return self._overhead("tag_switch_" + kind_, s, self.gang)

    # ---- trajectories: what a Generate ships and a Train unit's ranks pull (math.payload) ----
    def _traj_setup(self) -> None:
        """Our runtime moves trajectory rows through Ray's object store (docs/design/step.md, "Lean
        trajectories"): a Generate copies its rows' kept latents and log-probs to the host and
        into its store (object_store_send_s; a resumed segment first pulls the rows it resumes),
        and each rank of the trainer gang that runs a Train unit pulls its rows of the unit
        (object_store_pull_s, the ranks in parallel: the unit waits for the largest share) over
        links.inter_pool, or the pool's inter-node link under run.mode=colocated, or no wire when
        the testbed is one node. The colocated baselines and the peers keep trajectories on the
        GPU that made them: they pay nothing here."""
        tb = self.tb
        self._ships = self.system is None and (self.mode != "colocated" or self.style == RUNTIME)
        if len(tb.pools) == 1 and tb.pools[0].count <= tb.pools[0].gpus_per_node:
            self._traj_link = None
        else:
            self._traj_link = tb.link(self.trainer_pool, tb.n_gpus) if self.mode == "colocated" else tb.links.inter_pool
        self._traj_values = latent_values(tb.model, tb.shape) if self._ships else 0
        self._traj_loss = "dpo" if tb.pair_rows else tb.reads  # (math.payload.train_rows: dpo's ranks get the unit)
        self._traj_cols: dict = {}  # memo: ("columns", steps, t_done) -> latents a row ships; (n, columns) -> bytes

    def _columns(self, steps: tuple, t_done: int | None = None) -> float:
        """Latents a row ships when `steps` are its trained steps (math.payload.kept_steps), or,
        under per-sample draws, the mean count over the draws of len(steps) steps (expected_kept)."""
        key = ("columns", steps, t_done)
        c = self._traj_cols.get(key)
        if c is None:
            tb, n = self.tb, self.tb.denoise_steps
            if tb.window_draw == "sample" and tb.reads == "transitions":
                c = expected_kept(len(steps), n - 1, n, tb.reads, t_done)
            else:
                c = len(kept_steps(steps, n, tb.reads, t_done))
            self._traj_cols[key] = c
        return c

    def _gen_traj(self, unit: Generate) -> tuple:
        """(columns a resumed segment pulls per row, columns the unit ships per row); () when
        trajectories stay put. Counted on `window`: exact for a window of fixed size and place
        (all-but-last, first) and for a finished row of a contiguous one (k + 1 latents);
        a random window's first draw stands for the others (the runtime counts the trainers'
        side, `_train_traj`, which follows each unit's own steps)."""
        if not self._ships:
            return ()
        steps, n = self.window or tuple(range(self.tb.trained_steps)), self.tb.denoise_steps
        pull = self._columns(steps, unit.t_start) if unit.t_start > 0 else 0
        return pull, self._columns(steps, None if unit.t_end >= n else unit.t_end)

    def _train_traj(self, n: int, columns: float) -> tuple[float, float]:
        """(bytes the busiest rank of the gang pulls, bytes all its ranks pull) for a Train unit of
        n rows shipping `columns` latents each (math.payload.train_rows: each rank its share)."""
        key = (n, columns)
        out = self._traj_cols.get(key)
        if out is None:
            tb = self.tb
            row = row_bytes(columns, self._traj_values, tb.denoise_steps, tb.reads)
            shares = [z - a for r in range(self.gang)
                      for (a, z), _ in (train_rows(n, self.gang, self.trainer_sp, r, self._traj_loss),)]
            out = self._traj_cols[key] = (max(shares) * row, sum(shares) * row)
        return out

    # ---- the duration function -----------------------------------------------
    def __call__(self, worker: Worker, unit) -> float:
        """Seconds of `unit` on `worker`. Units of one shape on one kind of worker, in the same
        worker state (gathered parameters, reloaded optimizer state), cost the same: the first
        is priced, the others replay its seconds and its overhead increments (`memo`; the
        equivalence is tested against memo=False, tests/sim/test_simulate.py)."""
        dev = self.layout.device.get(worker.id)
        if dev is None:  # a replacement ("rollout-3+1": a spot join; "rollout-3'": after a loss) runs on its line's device
            dev = self.layout.device[worker.id.split("+")[0].rstrip("'")]
        switch = self._tag_switch(worker, unit) if self.tag else 0.0
        if self._ships and type(unit) is Train:  # what the runtime's transfer/trajectory_bytes counts
            n = self._rows(unit)[0]
            self.traj_bytes[unit.step] = (self.traj_bytes.get(unit.step, 0)
                                          + self._train_traj(n, self._columns(unit.t_steps))[1])
        if not self.memo:
            return switch + _UNIT_COST[type(unit)](self, worker, dev, unit)
        wid = worker.id
        key = self._unit_key(worker, dev, unit)
        hit = self._units.get(key)
        if hit is None:
            self._log = []
            t = _UNIT_COST[type(unit)](self, worker, dev, unit)
            self._units[key] = (t, tuple(self._log), self._gathered.get(wid))
            self._log = None
            return switch + t
        t, log, gathered = hit
        over = self.overhead_ws
        for name, v in log:
            over[name] = over.get(name, 0.0) + v
        if gathered is not None:
            self._gathered[wid] = gathered
        if type(unit) is Train and "offload_reload" in self._per_step:
            self._reloaded.add((wid, unit.step))
        return switch + t

    def wave(self, workers: dict, wids: list, unit) -> list[float]:
        """[self(workers[wid], unit) for wid in wids], for one wave (Scheduler.last_waves: a
        WeightSync to idle rollout workers, an OptimizerStep to parked trainers): the same seconds
        and state. Such a unit's price depends on the worker's role and device alone (`_unit_key`),
        so where every worker of the wave is a worker of the layout of one role on one device and
        that price is known (memo), each is that price plus the worker's own TAG switch (priced
        one by one, in order), and its overhead is replayed once per worker, name by name in the
        order one by one would add it (each name already counted, so no name moves in order)."""
        head, hit = self._wave_price(workers, wids, unit)
        if hit is None:  # one by one (after the first, where it was priced)
            return head + [self(workers[w], unit) for w in wids[len(head):]]
        t, log, gathered = hit
        first = workers[wids[0]]
        wids = wids[len(head):]
        k = len(wids)
        over = self.overhead_ws
        if self.tag and first.role == "trainer":  # as __call__: the switch, then the unit's price
            out = head + [self._tag_switch(workers[w], unit) + t for w in wids]
        else:
            out = head + [0.0 + t] * k
        per: dict = {}
        for name, v in log:
            per.setdefault(name, []).append(v)
        for name, vs in per.items():
            x = over[name]
            for _ in range(k):
                for v in vs:
                    x += v
            over[name] = x
        if gathered is not None:
            self._gathered.update(zip(wids, repeat(gathered)))
        return out

    def _wave_price(self, workers: dict, wids: list, unit) -> tuple[list, tuple | None]:
        """(the wave's first worker's seconds where `wave` priced it one by one, else [];
        the memo's (price, overhead log, gathered) `wave` replays for every worker, or None
        where they are priced one by one: not a WeightSync or OptimizerStep wave of one role on
        one device, not in the memo, or with overhead names not counted yet or TAG switches)."""
        kind = type(unit)
        if not (self.memo and len(wids) > 1 and (kind is WeightSync or kind is OptimizerStep)):
            return [], None
        device, trainers = self.layout.device, self.layout.trainer_ids
        first = workers[wids[0]]
        dev = device.get(first.id)
        if dev is None or list(map(device.get, wids)).count(dev) != len(wids) or not (
                trainers.issuperset(wids) if first.role == "trainer" else trainers.isdisjoint(wids)) or (
                first.role == "colocated" and any(workers[w].role != "colocated" for w in wids)):
            return [], None
        key = self._unit_key(first, dev, unit)
        head = [] if key in self._units else [self(first, unit)]  # the first priced as one by one would
        hit = self._units.get(key)
        over = self.overhead_ws
        if hit is not None and any(name not in over or name.startswith("tag_switch_") for name, _ in hit[1]):
            hit = None
        return head, hit

    def _unit_key(self, worker: Worker, dev: str, unit) -> tuple:
        """What a unit's cost depends on (see __call__)."""
        kind = type(unit)
        if kind is WeightSync:
            return (kind, dev)
        state = self._gathered.get(worker.id, False)
        if kind is OptimizerStep:
            return (kind, worker.role, dev)
        if kind is Reward:  # a generation fragment's rows, or the whole micro-batch's
            return (kind, worker.role, dev, self._rows(unit)[0])
        n, rows = self._rows(unit)
        if kind is Generate:
            return (kind, worker.role, dev, n, unit.t_end - unit.t_start,
                    self._prompts(n, rows) if unit.t_start == 0 else -1, state, self._gen_traj(unit))
        return (kind, worker.role, dev, n, len(unit.t_steps), state, (worker.id, unit.step) in self._reloaded,
                self._columns(unit.t_steps) if self._ships else 0)

    def _rows(self, unit) -> tuple[int, tuple[int, int]]:
        """Samples of a Generate / Train unit, and its (shard's) sample indices [first, last)
        within the step. Whole units too: with samples_per_group < group_size a micro-batch
        may start mid prompt group, and the prompts it encodes follow from where it starts
        (3 samples from sample 3 of groups of 2 touch prompts 1 and 2, not 3 // 2 = 1)."""
        spg = self.samples_per_group
        base = unit.groups[0] * spg  # sched.partition: a unit's groups are contiguous
        r = unit.samples
        if r is None:
            n = len(unit.groups) * spg
            return n, (base, base + n)
        return r[1] - r[0], (base + r[0], base + r[1])

    def _generate_unit(self, worker: Worker, dev: str, unit: Generate) -> float:
        n, rows = self._rows(unit)
        steps = unit.t_end - unit.t_start
        gang = worker.role == "trainer" and self.comm.gang > 1
        sp_rows, sp = n, self.rollout_gang if worker.role == "rollout" else 1
        if gang:  # TAG on a gang: the rows are shared out over its data groups (each of trainer_sp
            # ranks running its rows sequence-parallel; without sp a group is a rank), rank 0's has the most
            sp_rows, sp = -(-n // (self.comm.gang // self.trainer_sp)), self.trainer_sp
            t = self._gen(dev, sp_rows, steps, unit.t_start == 0, sp=sp)
        else:  # a rollout gang runs the unit whole, every rank on 1/rollout_gang of the tokens
            t = self._gen(dev, n, steps, unit.t_start == 0, rows, sp=sp)
        if self.system is not None:
            t += self._shipped_gen_extra(dev, n, steps, unit.t_start == 0, rows)
        if self._per_fwd:
            t += self._overhead("fsdp_gather", self._per_fwd * self._n_fwd(n) * steps)
        elif gang:  # every rank runs every forward (FSDP gathers in lockstep)
            gathers = self.comm.generate(steps, self._gathered.get(worker.id, False)) // self.comm.gather
            self._gathered[worker.id] = True
            t += self._overhead("gang_generate", self._exposed(gathers * self._gather_s(), t, gathers), self.gang)
        if sp > 1:  # the all-to-alls sit between attention and the rest of a block: nothing hides them
            gpus = self.gang if gang else self.rollout_gang
            t += self._overhead("gang_sp_generate", steps * self._sp_gen_s(sp_rows, sp, "trainer" if gang else "rollout"),
                                gpus)
        traj = self._gen_traj(unit)
        if traj:  # a gang's data groups move their own rows in parallel: rank 0's share
            rows_of = lambda c: (sp_rows if gang else n) * row_bytes(c, self._traj_values, self.tb.denoise_steps,  # noqa: E731
                                                                      self.tb.reads)
            pull, ship = traj
            if pull:
                t += self._overhead("trajectory_resume", object_store_pull_s(rows_of(pull), self._traj_link, dev))
            t += self._overhead("trajectory_ship", object_store_send_s(rows_of(ship), dev))
        return t

    def _reward_unit(self, worker: Worker, dev: str, unit: Reward) -> float:
        n, _ = self._rows(unit)  # a generation fragment's rows, or the whole micro-batch
        if self.system is not None and self.system.reward == "pool":  # scored on the reward pool: the decode stays
            t = self._decode(dev, n, self.tb.rollout_batch)
        else:
            t = self._reward(dev, n)
        if self.system is not None and self.system.decode_serial:  # one decode per sample (batch 1)
            t += self._overhead("decode_serial", max(0.0, self._decode(dev, n, 1)
                                                      - self._decode(dev, n, self.tb.rollout_batch)))
        return t

    def _decode(self, dev: str, n: int, batch: int) -> float:
        """VAE decode of n samples in batches of `batch`."""
        tb = self.tb
        return self._memo(("decode", dev, n, batch), lambda: _in_batches(
            n, batch, lambda b: self.cm.vae_decode_s(tb.model, dev, b, tb.shape)))

    def _train_unit(self, worker: Worker, dev: str, unit: Train) -> float:
        n, _ = self._rows(unit)
        n = self.tb.trained_rows(n)  # dpo: only its pairs' rows run forward/backward
        k = len(unit.t_steps)
        if self.system is not None and self.system.optimizer_steps > 1 and n > 1:
            t = self._mini_batches_s(worker, dev, n, k)
        elif self.mode == "colocated":  # each GPU trains its own rows, FSDP-gathering over its shard group
            t = self._train(dev, n, k)
            gang_rows = n * self.comm.gang  # GangComm splits rows over ranks: n each
        else:  # a gang splits the rows over its data groups (ranks, or trainer_sp ranks sequence-
            # parallel); rank 0's group has the most (ceil)
            t = self._train(dev, -(-n // (self.gang // self.trainer_sp)), k, sp=self.trainer_sp)
            gang_rows = n
        if self.system is not None:
            t += self._shipped_train_extra(dev, n, k)
        if self.comm.gang > 1 and not (self.system is not None and self.system.optimizer_steps > 1 and n > 1):
            t += self._overhead("gang_train", self._train_comm_s(worker, gang_rows, k, t),
                                self.gang if self.mode != "colocated" else 1)
        if self.trainer_sp > 1 and self.mode != "colocated":
            t += self._overhead("gang_sp_train", self._sp_train_s(-(-n // (self.gang // self.trainer_sp)), k),
                                self.gang)
        if self._recompute:
            t += self._overhead("recompute_logp", self._recompute_s(dev, n, len(unit.t_steps)))
        if "offload_reload" in self._per_step and (worker.id, unit.step) not in self._reloaded:
            self._reloaded.add((worker.id, unit.step))
            t += self._overhead("reload", self._per_step["offload_reload"] / 2)  # the state back before training
        if self._ships:  # the unit's rows, each rank its share, before its first pass
            busiest, _ = self._train_traj(self._rows(unit)[0], self._columns(unit.t_steps))
            t += self._overhead("trajectory_pull", object_store_pull_s(busiest, self._traj_link, dev), self.gang)
        return t

    def _optimizer_unit(self, worker: Worker, dev: str, unit: OptimizerStep) -> float:
        self._gathered[worker.id] = False  # the step reshards (and so does the publish after it)
        t = self._opt(dev)
        if self.system is not None:
            for name, s in self._per_step.items():
                t += self._overhead(name, s)
            if not self.system.reduce_every_backward and self.col_shards > 1:  # no_sync: once per optimizer step
                t += self._overhead("gang_reduce", self.system.optimizer_steps * self._reduce_scatter_s())
        elif self.mode == "colocated":
            if self._no_sync:  # the deferred reduction: once per optimizer step
                t += self._overhead("gang_reduce", self._reduce_scatter_s())
            t += self._overhead("phase_switch", self._per_step.get("phase_switch", 0.0))
            t += self._overhead("park", self._per_step.get("park", 0.0))
            t += self._overhead("offload_reload", self._per_step.get("offload_reload", 0.0) / 2)
        return t

    def _sync_unit(self, worker: Worker, dev: str, unit: WeightSync) -> float:
        return self._sync(dev)

    # ---- cached pieces (floats: the 4,096-GPU benchmark calls these millions of times)
    def _n_fwd(self, n: int) -> int:
        return -(-n // self.tb.rollout_batch)

    def _memo(self, key, fn):
        v = self._cache.get(key)
        if v is None:
            v = self._cache[key] = float(fn())
        return v

    def _gen(self, dev: str, n: int, steps: int, encode: bool, rows=None, sp: int = 1) -> float:
        tb, cm = self.tb, self.cm
        rb = tb.rollout_batch

        def per_step():
            return _in_batches(n, rb, lambda b: cm.denoise_s(tb.model, dev, b, tb.cfg, tb.shape, sp))

        t = steps * self._memo(("gen", dev, n, sp), per_step)
        if encode:  # one prompt per sample group; the text encoder runs once per prompt
            prompts = self._prompts(n, rows)
            t += self._memo(("enc", dev, prompts), lambda: cm.text_encode_s(tb.model, dev, prompts))
        return t

    def _prompts(self, n: int, rows) -> int:
        """Prompt groups a unit of n samples encodes: every group its rows touch (a group cut in
        two: both halves)."""
        g = self.tb.group_size
        return max(1, n // g) if rows is None else (rows[1] - 1) // g - rows[0] // g + 1

    def _reward(self, dev: str, n: int) -> float:
        tb, cm = self.tb, self.cm
        rb = tb.rollout_batch
        # A generative judge: prefill in batches, then the unit's n answers decode together (its
        # requests are concurrent) and end with the longest; a shipped reward phase decodes the whole
        # step's answers together instead (shipped.step_costs, judge_decode).
        serving = JudgeServing.of(tb, decode=False)
        per_unit = get_judge(tb.reward) is not None and not (self.system is not None and self.system.reward == "phase")

        def f():
            t = _in_batches(n, rb, lambda b: cm.reward_s(tb.model, dev, b, tb.reward, tb.shape, serving))
            return t + (float(cm.judge_decode_s(tb.reward, dev, n, JudgeServing.of(tb))) if per_unit else 0.0)
        return self._memo(("reward", dev, n), f)

    @property
    def _bb(self) -> int:
        """train.backward_batch: samples per pass of one trained step (0 with packed passes)."""
        return 0 if self.pairs_per_pass else self.tb.micro_batch

    def _train(self, dev: str, n: int, k: int, sp: int = 1) -> float:
        """k trained steps of n samples: per step in passes of micro_batch samples, or packed,
        the n * k (sample, step) pairs in passes of pairs_per_pass (learner.passes); each pass
        one training forward + backward (+ the KL reference forward, + DiffusionNFT's
        old-policy forward), priced at its batch by the calibration."""
        tb, cm = self.tb, self.cm

        def one(b: int) -> float:
            return (cm.train_s(tb.model, dev, b, tb.grad_ckpt, tb.lora, tb.train_cfg, tb.shape, sp)
                    + (self._fwd(dev, b, tb.train_cfg, 1, sp) if tb.kl else 0.0)
                    + (self._fwd(dev, b, tb.train_cfg, 1, sp) if tb.old_forward else 0.0))
        if self.pairs_per_pass:
            return self._memo(("train-packed", dev, n, k, sp), lambda: _in_batches(n * k, self.pairs_per_pass, one))
        return k * self._memo(("train", dev, n, sp), lambda: _in_batches(n, tb.micro_batch, one))

    def _fwd(self, dev: str, b: int, cfg: bool, calls: int, sp: int = 1) -> float:
        """One no-grad transformer forward of b samples (CostModel.recompute_logp_s for one step):
        CFG in one call over 2b rows, or two calls over b. sp: one sequence-parallel rank's share."""
        tb, cm = self.tb, self.cm

        def forward(rows_cfg: bool) -> float:
            if sp > 1:
                return float(cm.denoise_s(tb.model, dev, b, rows_cfg, tb.shape, sp))
            return float(cm.recompute_logp_s(tb.model, dev, b, 1, rows_cfg, tb.shape))
        return 2 * forward(False) if cfg and calls == 2 else forward(cfg)

    # ---- a shipped system's mechanisms (shipped.py), beyond what our units cost ----------
    def _shipped_gen_extra(self, dev: str, n: int, steps: int, encode: bool, rows) -> float:
        """Generate: CFG as two calls, sampling through the FSDP module, text encoding per sample."""
        tb, cm, sy = self.tb, self.cm, self.system
        rb, t = tb.rollout_batch, 0.0
        if tb.cfg and sy.cfg_calls == 2:
            extra = self._memo(("cfg2", dev, n), lambda: _in_batches(
                n, rb, lambda b: self._fwd(dev, b, True, 2) - self._fwd(dev, b, True, 1)))
            t += self._overhead("cfg_two_calls", steps * extra)
        if sy.sampler == "fsdp" and self.col_shards > 1:
            calls = sy.cfg_calls if tb.cfg else 1
            link = self.gang_link
            per = self._memo(("sgather", dev, n), lambda: _in_batches(n, rb, lambda b: calls * float(
                cm.fsdp_gather_per_forward_s(tb.model, dev, self.col_shards, link, b, tb.cfg and calls == 1, tb.shape))))
            t += self._overhead("fsdp_gather", steps * per)
        if encode and sy.encode_per_sample:
            prompts = self._prompts(n, rows)
            requests = n * (2 if tb.cfg else 1)  # each sample a request; the negative prompt encoded too
            t += self._overhead("encode_per_sample", max(0.0, float(cm.text_encode_s(tb.model, dev, requests))
                                                          - float(cm.text_encode_s(tb.model, dev, prompts))))
        return t

    def _shipped_train_extra(self, dev: str, n: int, k: int) -> float:
        """Train: CFG as two calls (policy and reference), and a gradient all-reduce after every
        backward when a replicated system has no no_sync."""
        tb, cm, sy = self.tb, self.cm, self.system
        t = 0.0
        if tb.train_cfg and sy.train_cfg_calls == 2:
            def extra(b):
                two = 2 * float(cm.train_s(tb.model, dev, b, tb.grad_ckpt, tb.lora, False, tb.shape))
                one = float(cm.train_s(tb.model, dev, b, tb.grad_ckpt, tb.lora, True, tb.shape))
                ref = (self._fwd(dev, b, True, 2) - self._fwd(dev, b, True, 1)) if tb.kl else 0.0
                return two - one + ref
            t += self._overhead("cfg_two_calls_train", k * self._memo(("tcfg2", dev, n),
                                                                lambda: _in_batches(n, tb.micro_batch, extra)))
        if sy.shard == "replicated" and sy.reduce_every_backward and self.n_trainers > 1:
            passes = k * -(-n // tb.micro_batch)
            ar = float(allreduce_s(4 * self.trainable_B * 1e9, self.n_trainers,
                                   tb.link(self.trainer_pool, self.n_trainers)))
            t += self._overhead("gang_backward_reduce", passes * ar)
        return t

    def _mini_batches_s(self, worker: Worker, dev: str, n: int, k: int) -> float:
        """A shipped system's Train unit cut into its optimizer_steps mini-batches (its update loop
        runs each mini-batch's micro-batches as passes of their own): the compute of each, and on an
        FSDP shard group each pass's gathers and reduce-scatters (GangComm), what compute cannot hide."""
        m = min(self.system.optimizer_steps, n)
        t = 0.0
        for rows in (n // m + (i < n % m) for i in range(m)):
            c = self._train(dev, rows, k)
            if self.comm.gang > 1:
                c += self._overhead("gang_train", self._train_comm_s(worker, rows * self.comm.gang, k, c))
            t += c
        return t

    def _recompute_s(self, dev: str, n: int, k: int) -> float:
        tb, sy = self.tb, self.system
        batch = (sy.logp_batch if sy is not None and sy.logp_batch else tb.micro_batch)
        calls = sy.train_cfg_calls if sy is not None else 1

        def per_step():  # old log-probs of one trained step, in the log-prob micro-batches
            return _in_batches(n, batch, lambda b: self._fwd(dev, b, tb.train_cfg, calls))
        t = k * self._memo(("recompute", dev, n), per_step)
        if sy is not None and self.col_shards > 1:  # each no-grad forward gathers every FSDP unit again
            gathers = k * -(-n // batch)
            t += self._overhead("gang_recompute", self._exposed(gathers * self._gather_s(), t, gathers))
        return t

    # ---- sequence-parallel gangs (sim.sp: the bytes the runtime counts) ----------
    def _sp_setup(self) -> None:
        """Sequence-parallel dims and links; a rollout gang rank must hold the whole model and
        1/rollout_gang of a forward's activations."""
        tb = self.tb
        self.sp_dims = None
        if self.rollout_gang == 1 and self.trainer_sp == 1:
            return
        self.sp_dims = SpDims.from_catalogue(tb.model, tb.shape)
        self.sp_tokens = image_tokens_for(tb.model, tb.shape)
        self.sp_links = {"trainer": tb.link(self.trainer_pool, self.trainer_sp)}
        rollout = [w for w in self.layout.workers if w.role == "rollout"]
        if self.rollout_gang > 1 and rollout:
            pool = self.layout.pool[rollout[0].id]
            self.sp_links["rollout"] = tb.link(pool, self.rollout_gang)
            fit = self.cm.fits(tb.model, ["rollout"], pool.device, gen_batch=tb.rollout_batch, cfg=tb.cfg,
                               shape=tb.shape, sp=self.rollout_gang)
            if not fit.fits:
                raise ValueError(f"{tb.name}: a rollout gang rank of {self.rollout_gang} {pool.device} does not hold "
                                 f"the {tb.model} forward ({fit.peak_gib:.0f} GiB of {fit.usable_gib:.0f} usable): "
                                 "raise runtime.rollout.gang")

    def _sp_call_s(self, b: int, sp: int, pool: str, backward: bool = False) -> float:
        """One transformer call's sequence-parallel collectives over b rows (CFG rows included)
        on a gang's link: the all-to-alls (pairwise), the gathers and reduce-scatters (ring),
        one message round per call (sp.forward_bytes' calls). pool: rollout | trainer (the link)."""
        def f():
            d = self.sp_dims
            recompute = backward and self.tb.grad_ckpt
            nb = forward_bytes(d, b, self.sp_tokens, sp, BYTES_WEIGHT, backward, recompute)
            passes = 1 + backward + recompute  # a2a rounds: forward, backward, recomputed forward
            text = d.attn_layers if d.text_tokens else 0
            link = self.sp_links[pool]
            return (alltoall_traffic(nb["all_to_all"], sp, 4 * d.attn_layers * passes).seconds(link)
                    + allgather_traffic(nb["all_gather"], sp, text * (1 + recompute) + 1).seconds(link)
                    + allgather_traffic(nb["reduce_scatter"], sp, text * backward).seconds(link))
        return self._memo(("spcall", b, sp, pool, backward), f)

    def _sp_gen_s(self, n: int, sp: int, pool: str) -> float:
        """One denoising step of n samples on a sequence-parallel group: forwards of
        rollout_batch samples, CFG doubling each (one call)."""
        c = 2 if self.tb.cfg else 1
        return _in_batches(n, self.tb.rollout_batch, lambda b: self._sp_call_s(b * c, sp, pool))

    def _sp_train_s(self, n: int, k: int) -> float:
        """k trained steps of n samples on a trainer group: per pass (learner.passes: per step in
        micro-batches, or packed pairs) the training forward + backward (+ recompute), and the KL
        reference forward."""
        tb, sp, c = self.tb, self.trainer_sp, 2 if self.tb.train_cfg else 1

        def one(b: int) -> float:
            return (self._sp_call_s(b * c, sp, "trainer", True)
                    + (self._sp_call_s(b * c, sp, "trainer") if tb.kl else 0.0)
                    + (self._sp_call_s(b * c, sp, "trainer") if tb.old_forward else 0.0))
        if self.pairs_per_pass:
            return _in_batches(n * k, self.pairs_per_pass, one)
        return k * _in_batches(n, tb.micro_batch, one)

    # ---- gang collectives (sim.gangs: the bytes the runtime counts) -------------
    def _gather_s(self) -> float:
        """One all-gather of every FSDP unit over the gang (ring, one collective per unit)."""
        n = self.comm.gang
        return self._memo(("gather1", n), lambda: allgather_traffic(
            self.fsdp.all_gather_bytes(n), n, chunks=len(self.fsdp.units)).seconds(self.gang_link))

    def _publish_gather_s(self) -> float:
        """The publish gather over the gang: the payload's tensors (GangComm.publish), one
        collective per tensor-holding unit."""
        n, c = self.comm.gang, self.comm
        units = sum(u.trainable for u in self.fsdp.units) if c.adapters_only else len(self.fsdp.units)
        return self._memo(("pub1", n, c.adapters_only), lambda: allgather_traffic(
            self.fsdp.payload_gather_bytes(n, c.adapters_only), n, chunks=units).seconds(self.gang_link))

    def _reduce_scatter_s(self) -> float:
        """One backward's reduce-scatters (fp32 gradients of the trainable units): a ring
        reduce-scatter moves what the matching all-gather moves."""
        n = self.comm.gang
        return self._memo(("rs1", n), lambda: allgather_traffic(
            self.fsdp.reduce_scatter_bytes(n), n,
            chunks=sum(u.trainable for u in self.fsdp.units)).seconds(self.gang_link))

    def _exposed(self, comm_s: float, compute_s: float, gathers: int) -> float:
        """What FSDP's prefetch cannot hide: the collectives beyond the compute they overlap,
        plus each gather's first unit (nothing to overlap it with yet)."""
        return max(0.0, comm_s - compute_s) + gathers * self._gather_s() / len(self.fsdp.units)

    def _train_comm_s(self, worker: Worker, rows: int, k: int, compute_s: float) -> float:
        """Exposed gathers and reduce-scatters of a Train unit on a gang (GangComm's counts)."""
        c = self.comm
        ag, rs = c.train(rows, k, self._gathered.get(worker.id, False))
        self._gathered[worker.id] = True
        gathers = ag // c.gather
        if (self.system is not None and not self.system.reduce_every_backward) or self._no_sync:
            rs = 0  # accumulation under no_sync: reduced once per optimizer step (OptimizerStep)
        comm_s = gathers * self._gather_s() + (rs // (c.gang * self.fsdp.reduce_scatter_bytes(c.gang))) * \
            self._reduce_scatter_s()
        return self._exposed(comm_s, compute_s, gathers)

    def _opt(self, dev: str) -> float:
        def f():
            tb, cm = self.tb, self.cm
            t = self._grad_reduce_s() + float(cm.optimizer_step_s(self.trainable_B / self.opt_shards, dev))
            if self.offload:  # AdamW state (12 B/param, this rank's shard) to the GPU and back
                t += float(cm.offload_reload_s(self.trainable_B, dev, self.opt_shards, needed=True))
            return t + self._publish_s(dev)
        return self._memo(("opt", dev), f)

    def _grad_reduce_s(self) -> float:
        """The once-per-step gradient reduction.

        Gangs (ours): every rank all-reduces its local gradient sums (float64 or float32 by
          train.grad_sum, + an fp32 mask) with its peers in the other gangs; nothing with one gang.
        Colocated baselines: replicated (DDP) all-reduce the bf16 gradients over every GPU;
          FSDP over every GPU reduced in the per-backward reduce-scatters already; FSDP per
          node (HSDP) all-reduce the fp32 shards across the nodes.
        """
        tb, n = self.tb, self.n_trainers
        if self.mode != "colocated":
            if n <= 1:
                return 0.0
            link = tb.link(self.trainer_pool, n * self.gang)  # our trainers: train.grad_sum's default, auto
            return float(allreduce_s(self.fsdp.cross_gang_bytes(self.gang, self.fsdp.grad_sum_bytes()), n, link))
        s = self.col_shards
        if s == 1:
            return float(allreduce_s(BYTES_GRAD * self.trainable_B * 1e9, n, tb.link(self.trainer_pool, n)))
        replicas = n // s
        return float(allreduce_s(self.fsdp.cross_gang_bytes(s), replicas, tb.link(self.trainer_pool, n)))

    def _publish_s(self, dev: str) -> float:
        """Trainer side of a weight sync, inside OptimizerStep (the scheduler's pull model).

        Colocated: nothing (same weights). A gang of N > 1 first gathers the payload's tensors
        on trainer-0 (every unit's under object-store; the adapters only under lora-only and
        nccl with LoRA, as the runtime's gather_payload does). nccl: device->host into the
        relay's pinned buckets (one trainer: its live tensors on the relay's stream, which the
        trainer's stream waits for; a gang: rank 0 copies each gathered tensor straight in),
        never a send: the chain is the rollout's WeightSync. object-store / lora-only:
        device->host + one copy into the store.
        """
        if self.mode == "colocated" or self.n_rollout == 0:
            return 0.0
        tb, nbytes = self.tb, self._sync_bytes()
        t = self._publish_gather_s() if self.gang > 1 else 0.0
        if tb.weight_sync == "nccl":
            return t + pcie_s(nbytes, dev)
        return t + object_store_send_s(nbytes, dev)

    def _sync_bytes(self) -> int:
        """Bytes one sync moves: adapters only with lora-only, and with nccl under LoRA (the
        relay sends the trainable tensors, gangs.md); else the bf16 weights."""
        tb = self.tb
        adapters = tb.weight_sync == "lora-only" or (tb.weight_sync == "nccl" and tb.lora)
        return self.cm.weight_bytes(tb.model, lora=adapters, rank=tb.lora_rank)

    def _sync(self, dev: str) -> float:
        def f():
            tb, cm, nbytes = self.tb, self.cm, self._sync_bytes()
            rpool = next(self.layout.pool[w.id] for w in self.layout.workers if w.role == "rollout")
            full = float(cm.weight_sync_s(nbytes, tb.links.inter_pool, self.n_rollout, tb.weight_sync,
                                          self.trainer_device, dev, rpool.gpus_per_node))
            if tb.weight_sync == "nccl":
                return full
            return full - object_store_send_s(nbytes, self.trainer_device)  # the sender's leg is in OptimizerStep
        return self._memo(("sync", dev), f)


_UNIT_COST = by_kind(generate=DurationFn._generate_unit, reward=DurationFn._reward_unit,
                     train=DurationFn._train_unit, optimizer=DurationFn._optimizer_unit,
                     sync=DurationFn._sync_unit)


def make_duration_fn(testbed: Testbed, cost_model: CostModel, run: RunContract, *,
                     style: str | None = None, zero_baseline: bool = False, memory: str | None = None,
                     check_memory: bool = True) -> DurationFn:
    """duration_fn(worker, unit) -> seconds for `mode` on `testbed` (see module doc).

    The returned object is callable and carries `.layout.workers` (pass them to the
    Scheduler), `.overhead_ws` (baseline costs paid, worker-seconds) and
    `.colocated_config` (the colocated memory plan used). `style` picks the colocated
    row: "colocated-ideal" (default) or a shipped system (shipped.SYSTEMS); `zero_baseline`
    removes its extra costs.
    """
    t = run.pool("trainer") or run.pool("colocated")
    if run.sched.mode == "colocated" and t is not None and t.resources.sp > 1:
        from digenrl.config.errors import ConfigError

        raise ConfigError("runtime.trainer.sp: the simulator prices sequence-parallel gangs on disaggregated "
                          "pools only (run.mode=colocated samples and trains on the baselines' memory plans); "
                          "set 1, or a disaggregated mode")
    lay = layout(testbed, run)
    mode, spg = run.sched.mode, run.sched.samples_per_group
    if testbed.group_size % spg:
        raise ValueError(f"samples_per_group={spg} must divide group_size={testbed.group_size}")
    if mode == "colocated" and style is None:  # a run's own config: what the runtime runs
        style = RUNTIME
    t = run.pool("trainer").resources if run.pool("trainer") else None
    gang = dict(gang=t.gang, after_step=t.reshard == "after-step", offload=t.offload, trainer_sp=t.sp) if t else {}
    r = run.pool("rollout")
    if r is not None:
        gang["rollout_gang"] = r.resources.gang
    return DurationFn(testbed, cost_model, mode, lay, spg, style=style, zero_baseline=zero_baseline, memory=memory,
                      check_memory=check_memory, pairs_per_pass=run.shape.pairs_per_pass,
                      window=run.sched.trained(run.sched.first_step),
                      **gang)


def _in_batches(n: int, batch: int, cost) -> float:
    """Seconds for n samples run as full batches of `batch` plus one remainder batch."""
    full, rest = divmod(n, batch)
    return full * cost(batch) + (cost(rest) if rest else 0.0)
