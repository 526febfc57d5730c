"""config.runtime: the Ray runtime (RuntimeConfig) and its worker pools (PoolConfig)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

from digenrl.config.errors import ConfigError, check, one_of

SHARD_KINDS = ("none", "fsdp")
RESHARD_KINDS = ("after-forward", "after-step")
# rollout-pool keys of spot workers and autoscaling (refused on the other pools)
SPOT_KEYS = ("preemptible", "notice_s", "notices", "preemptions", "max_workers", "watch", "metadata_url",
             "watch_poll_s")
WATCH_CLOUDS = ("aws", "gce", "azure")  # runtime.rollout.watch: whose metadata service each node's watcher polls
# runtime.trainer.tag_offload: when a trainer's TAG switch offloads its uncommitted state (sim/tag_switch.py)
TAG_OFFLOAD = ("auto", "always", "never")
# runtime.weight_sync: how new weights reach the rollout workers (the simulator prices each)
WEIGHT_SYNC_METHODS = ("object-store", "nccl", "lora-only")

COMPUTE = ("real", "emulated")
PLAN = ("auto", "always", "never")  # not on/off: YAML reads those as booleans


@dataclass
class PoolConfig:
    """One worker pool: how many workers and what each one reserves on the Ray cluster."""

    workers: int = 1  # workers (scheduler workers, each a gang of `gang` ranks) in this pool
    num_cpus: float = 1.0  # CPUs each rank reserves on the Ray cluster
    num_gpus: float = 0.0  # GPUs each rank reserves (fractions share a GPU); 0 = CPU only
    accelerator: Optional[str] = None  # Ray accelerator_type, e.g. "H200" or "L40S" (heterogeneous clusters)
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources, e.g. node labels
    # ranks (Ray actors, one device each) per worker, which run each unit together (SPMD).
    # Trainer pool: the devices one sharded model spans (shard=fsdp). Rollout pool: the
    # sequence-parallel degree; the gang runs each trajectory whole, every rank on its slice of
    # the tokens, full weights on each rank. Reward pool: 1
    gang: int = 1
    # trainer pool only: fsdp = FSDP2 over the gang's devices, gradients all-reduced across
    # gangs once per RL step (HSDP); none = every rank holds the whole model
    shard: str = "none"
    # trainer pool, shard=fsdp: after-forward frees the gathered parameters after each forward
    # (ZeRO-3); after-step keeps them for the whole RL step (one gather per step)
    reshard: str = "after-forward"
    offload: bool = False  # trainer pool, shard=fsdp: AdamW state on the host (FSDP2 CPU offload)
    # trainer pool: sequence-parallel degree inside the gang (Ulysses; video families): sp ranks
    # run the same rows, each on its slice of the video tokens (digenrl/models/sequence_parallel.py)
    sp: int = 1
    # rollout pool only: spot (preemptible) workers (docs/guides/spot.md). A
    # notice (SIGTERM to a worker's process, a file in `notices`, or the `preemptions` trace)
    # drains the worker before its deadline; past the deadline it is killed and its work
    # regenerated as a lost node's
    preemptible: bool = False
    notice_s: float = 30.0  # preemptible: seconds to the deadline when a notice gives none (SIGTERM, an empty file)
    # preemptible: the directory where a file named after a worker is its notice (its content:
    # empty, seconds, or AWS's instance-action JSON); None = RUN_DIR/notices
    notices: Optional[str] = None
    # preemptible: a sched.preemption trace (JSON lines of notices and joins, seconds from the
    # run's start; emulated compute: modelled seconds) sent on the run's clock; a join starts a
    # rollout worker. The simulator reads the same file
    preemptions: Optional[str] = None
    # rollout pool: ask Ray's autoscaler (ray.autoscaler.sdk.request_resources) for room for up
    # to this many workers, and add workers as nodes appear; 0 = off (the pool stays `workers`)
    max_workers: int = 0
    # trainer pool, modes where trainers generate (TAG modes, colocated): at each switch to
    # generation (runtime/tag_switch.py), when gradients have accumulated, move AdamW state,
    # gradients, float64 gradient sums and (full fine-tune) the trainable weights to the host
    # and restore them bit for bit afterwards. auto: when the rank's memory in use plus the
    # last generation's peak exceeds the usable device memory (sim/memory.py's rule; never on
    # a CPU); always; never. A sharded gang's ranks move their shards; its masters stay (the
    # generation gathers them). Counted: tag/* step metrics
    tag_offload: str = "auto"
    # preemptible: the cloud whose metadata service a watcher on each node with spot workers polls
    # (aws: IMDSv2 spot/instance-action; gce: instance/preempted; azure: Scheduled Events), its
    # answer written as the notice of every worker on that node (runtime/cloud_notices.py); None = off
    watch: Optional[str] = None
    # watch: the metadata service's base URL; None = the cloud's (http://169.254.169.254, GCE's
    # http://metadata.google.internal). "{node_id}" / "{node_ip}" in it: the watcher's node
    metadata_url: Optional[str] = None
    watch_poll_s: float = 2.0  # watch: seconds between polls (gce: the longest a wait_for_change hangs)

    def check(self, key: str, minimum: int) -> None:
        check(self.workers >= minimum, f"{key}.workers", f"must be >= {minimum}, got {self.workers}")
        check(self.num_cpus >= 0 and self.num_gpus >= 0, key, "num_cpus and num_gpus must be >= 0")
        check(self.gang >= 1, f"{key}.gang", f"must be >= 1 (devices per worker), got {self.gang}")
        one_of(self.shard, f"{key}.shard", SHARD_KINDS)
        one_of(self.reshard, f"{key}.reshard", RESHARD_KINDS)
        one_of(self.tag_offload, f"{key}.tag_offload", TAG_OFFLOAD)
        check(not self.offload or self.shard == "fsdp", f"{key}.offload",
              "offloads the sharded optimizer state: needs shard=fsdp")

    def _not_spot(self, key: str, why: str) -> None:
        """Refuse the rollout-only keys (spot workers, autoscaling) on another pool."""
        for name in SPOT_KEYS:
            check(getattr(self, name) == getattr(PoolConfig, name), f"{key}.{name}",
                  f"only the rollout pool is preemptible or autoscaled: {why}")

    def check_trainer(self, key: str) -> None:
        self.check(key, 1)
        self._not_spot(key, "a trainer holds gradient and optimizer state that a reclaim would lose")
        check(self.gang == 1 or self.shard == "fsdp", f"{key}.shard",
              f"a gang of {self.gang} devices trains one sharded model: set shard=fsdp (or gang=1)")
        check(self.sp >= 1 and self.gang % self.sp == 0, f"{key}.sp",
              f"the sequence-parallel degree must divide {key}.gang={self.gang}, got {self.sp}")

    def _trainer_only(self, key: str) -> None:
        check(self.tag_offload == "auto", f"{key}.tag_offload",
              "acts on a trainer's switches to generation: a runtime.trainer key")

    def check_rollout(self, key: str) -> None:
        """The rollout pool: a gang is a sequence-parallel group (full weights on every rank)."""
        self.check(key, 0)
        self._trainer_only(key)
        check(self.shard == "none" and not self.offload and self.reshard == "after-forward", f"{key}.shard",
              "only the trainer pool shards (shard, reshard, offload are trainer keys)")
        check(self.sp == 1, f"{key}.sp", f"a rollout gang's sequence-parallel degree is {key}.gang; leave sp at 1")
        check(math.isfinite(self.notice_s) and self.notice_s >= 0, f"{key}.notice_s",
              f"must be a finite number of seconds >= 0, got {self.notice_s}")
        if self.watch is not None:
            one_of(self.watch, f"{key}.watch", WATCH_CLOUDS)
        check(math.isfinite(self.watch_poll_s) and self.watch_poll_s > 0, f"{key}.watch_poll_s",
              f"must be a finite number of seconds > 0, got {self.watch_poll_s}")
        check(self.metadata_url is None or self.metadata_url.startswith(("http://", "https://")),
              f"{key}.metadata_url", f"must be an http(s):// URL, got {self.metadata_url!r}")
        check(self.watch is not None or (self.metadata_url is None and self.watch_poll_s == PoolConfig.watch_poll_s),
              f"{key}.metadata_url" if self.metadata_url is not None else f"{key}.watch_poll_s",
              f"belongs to the metadata watcher: set {key}.watch to one of {', '.join(WATCH_CLOUDS)}")
        if not self.preemptible:
            for name in ("notice_s", "notices", "preemptions", "watch"):
                check(getattr(self, name) == getattr(PoolConfig, name), f"{key}.{name}",
                      f"acts on spot workers only: set {key}.preemptible=true")
        if self.preemptions:
            from digenrl.sched.preemption import read_trace

            try:
                read_trace(self.preemptions)
            except (OSError, ValueError) as e:
                raise ConfigError(f"{key}.preemptions: {e}") from None
        for name in ("preemptible", "max_workers"):  # both add rollout workers mid-run (joins, nodes)
            check(self.workers >= 1 or not getattr(self, name), f"{key}.{name}",
                  f"a run that starts without rollout workers publishes no weights for any that join: "
                  f"set {key}.workers >= 1")
        check(self.max_workers == 0 or self.max_workers >= max(self.workers, 1), f"{key}.max_workers",
              f"is the pool's upper bound: 0 (no autoscaling) or >= {key}.workers={self.workers} (and >= 1), "
              f"got {self.max_workers}")

    def check_single(self, key: str) -> None:
        """The reward pool: one device per worker, no sharding."""
        self.check(key, 0)
        self._trainer_only(key)
        self._not_spot(key, "the reward pool neither drains on a notice nor scales")
        check(self.gang == 1 and self.sp == 1, f"{key}.gang", "reward workers are one device each; set 1")
        check(self.shard == "none" and not self.offload and self.reshard == "after-forward", f"{key}.shard",
              "only the trainer pool shards (shard, reshard, offload are trainer keys)")


@dataclass
class RuntimeConfig:
    """The Ray runtime (every run.mode except local)."""

    address: Optional[str] = None  # an existing cluster; None = $RAY_ADDRESS, else start a local one
    # colocated: one pool of rollout.workers + trainer.workers devices that generate and
    # train (rollout.workers may be 0); TAG modes may run without a rollout pool too.
    rollout: PoolConfig = field(default_factory=lambda: PoolConfig(workers=2))
    trainer: PoolConfig = field(default_factory=lambda: PoolConfig(workers=1))
    reward: PoolConfig = field(default_factory=lambda: PoolConfig(workers=0))  # 0 = on the generating worker
    # object-store | lora-only (adapters only) | nccl: trainer 0's relay sends each rollout pull
    # point-to-point over a process group (NCCL on GPU, gloo on CPU; runtime/relay.py)
    weight_sync: str = "object-store"
    # the network interface (e.g. eth0, ib0, bond0) that gloo and NCCL collectives and the weight
    # relay use on every node: each actor gets GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, and
    # process-group and relay addresses are that interface's IPv4 address. None = Ray's node IP
    # and the libraries' own choice (docs/guides/cluster.md "Networks")
    network_interface: Optional[str] = None
    # real: workers load the model and compute; emulated: real Ray actors that sleep for the
    # cost model's time of each unit (no model or reward is loaded); the
    # schedule (pools, data shape, shards, segments) is this config's, the hardware and the
    # model's costs are the testbed's (digenrl.sim.workload)
    compute: str = "real"
    testbed: Optional[str] = None  # emulated: a testbed preset or YAML file (hardware, links, costs)
    time_scale: float = 1.0  # emulated: wall seconds per modelled second
    # TAG (trainer-assisted generation): denoising steps a trainer generates before it checks
    # for training work (and, if there is some, hands the partial trajectory to a rollout worker)
    tag_segment: int = 1
    # TAG: a trainer with training work ready at a segment boundary hands its partial trajectory
    # to a rollout worker (true), or finishes the trajectory first (false: no mid-trajectory switch)
    tag_handback: bool = True
    rollout_segment: int = 0  # denoising steps per rollout Generate unit; 0 = whole trajectory
    gen_shard: int = 1  # Generate units per micro-batch along the sample axis (1 = whole micro-batch)
    train_shard: int = 1  # Train units per (micro-batch, TSP (time-step parallelism) chunk) along the sample axis (1 = off)
    worker_threads: int = 1  # torch intra-op threads per Ray worker process (run.threads is local mode's)
    # Plan the run at hand (digenrl.sim.here): time each unit kind on this cluster, then pick
    # the pool split (same total), data.micro_batch_groups and train.tsp_chunk that the
    # config does not set. auto: only when the config file and overrides give no pool size;
    # always: also when they do (then the split stays); never. A Config built in code counts
    # as all given.
    plan: str = "auto"
    # RL steps of each probe: runtime.plan runs the config as given and the best other
    # candidates this many steps on their own actors (no evaluation, no checkpoint; in
    # <run_dir>/probes/N) to measure what the runtime adds to each unit: per unit kind, how much
    # longer it takes than its profiled compute, and the gap before the next unit
    # (digenrl.sim.here.RuntimeCosts); the first step (warm-up) and the last (drain) are not
    # measured. 0 = no probe: the plan prices the profiled compute only. None = 4 where the
    # workers share a machine's CPU cores, 0 where each holds a GPU (a probe there loads the
    # model again and runs whole steps: set it to probe GPU pools)
    plan_probe_steps: Optional[int] = None
    # Deadlines of the driver's waits (docs/guides/running.md, "Waits and their deadlines"): a passed
    # one stops the run naming what it waited for. This one: seconds a worker (first placement,
    # replacement, elastic addition, the planning profile) may wait for the resources it asks
    # for; the message names those the cluster lacks
    placement_timeout_s: float = 120.0
    # seconds placed workers may take to come up and get ready (model and rewarder load,
    # process groups, checkpoint load, initial weights), and for the final weights
    start_timeout_s: float = 1800.0
    # seconds the event loop may go without any unit finishing before it stops the run
    # with the scheduler's state (a watchdog: raise it for units longer than that); also
    # the end-of-run wait for evaluations and checkpoint saves
    stall_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        self.rollout.check_rollout("runtime.rollout")
        self.trainer.check_trainer("runtime.trainer")
        self.reward.check_single("runtime.reward")
        one_of(self.weight_sync, "runtime.weight_sync", WEIGHT_SYNC_METHODS)
        one_of(self.compute, "runtime.compute", COMPUTE)
        one_of(self.plan, "runtime.plan", PLAN)
        check(self.plan_probe_steps in (None, 0) or self.plan_probe_steps >= 3, "runtime.plan_probe_steps",
              "must be 0 (no probe) or >= 3 (the first step warms the actors up and the last drains: "
              "neither is measured)")
        check(self.compute != "emulated" or bool(self.testbed), "runtime.testbed",
              "compute=emulated needs a testbed (file or preset) whose cost model the workers sleep for")
        check(self.time_scale > 0, "runtime.time_scale", "must be > 0")
        check(self.tag_segment >= 1, "runtime.tag_segment", "must be >= 1")
        check(self.rollout_segment >= 0, "runtime.rollout_segment", "must be >= 0 (0 = whole trajectory)")
        check(self.gen_shard >= 1, "runtime.gen_shard", "must be >= 1 (1 = unsharded)")
        check(self.train_shard >= 1, "runtime.train_shard", "must be >= 1 (1 = unsharded)")
        check(self.worker_threads >= 1, "runtime.worker_threads", "must be >= 1")
        check(self.network_interface is None or bool(re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", str(self.network_interface))),
              "runtime.network_interface", f"an interface name as `ip link` lists it (e.g. eth0, ib0), "
              f"got {self.network_interface!r}")
        for key in ("placement_timeout_s", "start_timeout_s", "stall_timeout_s"):
            check(getattr(self, key) > 0, f"runtime.{key}", "must be > 0 (seconds)")

        self._check_plan()
        self._check_emulated()

    def _check_plan(self) -> None:
        """runtime.plan and its probes plan a Ray run on real compute."""
        check(self.plan != "always" or self.compute == "real", "runtime.plan",
              "always plans a Ray run on real compute; emulated compute has nothing to plan (use auto or never)")
        check(self.plan_probe_steps in (None, 0) or (self.plan != "never" and self.compute == "real"),
              "runtime.plan_probe_steps", "sizes runtime.plan's probes of a Ray run on real compute; with "
              f"runtime.plan={self.plan} and runtime.compute={self.compute} nothing is planned: leave it unset")

    def _check_emulated(self) -> None:
        """Emulated workers sleep on Ray actors: the keys that act on real nodes are refused."""
        if self.compute != "emulated":
            return
        check(self.rollout.max_workers == 0, "runtime.rollout.max_workers",
              "emulated workers ask for no nodes, so there is nothing to autoscale; spot replacements "
              "come from the joins of runtime.rollout.preemptions")
        check(self.reward.workers == 0, "runtime.reward.workers",
              "emulated compute models rewards on the generating worker; set 0")
        check(self.rollout.watch is None, "runtime.rollout.watch",
              "emulated workers run on no cloud's machine; their notices come from runtime.rollout.preemptions")
        check(self.network_interface is None, "runtime.network_interface",
              "emulated workers sleep and run no collectives or relay; leave it unset")
