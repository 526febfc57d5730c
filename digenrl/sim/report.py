"""Measuring simulated runs, and the report that puts modes side by side.

One run: testbed + mode + knobs -> the Config that runs them -> its contract (the
scheduler config and pools the runtime would use) on the virtual clock -> metrics.

    RunSpec (mode, n_rollout, micro_batch_groups, samples_per_group, tsp_chunk, tag_segment,
             gen_shard, train_shard)
      --workload.config_for--> Config --contract--> SchedConfig + workers
      --Scheduler + workload.duration_fn--> run_virtual --> Trace
      --measure--> RunResult (steady-state throughput, bubbles, staleness, breakdown)

RunSpec (digenrl/sim/workload.py, beside config_for) is the planner's search point;
`RunSpec.overrides` names each knob by the Config key that holds it, which is what `digenrl
plan` prints and writes. The modules import one way: workload <- report <- planner <-
simulate (ROWS, the report's rows in their order, live here).

Steady state. An RL run is long; a simulated one is a few steps, so its ends would
dominate: the first steps fill the pipeline (the modes that generate ahead, one-step-off and
TCSS, reach their steady pattern after ~5 steps, often a cycle of 2-3 steps of different
lengths), and the last step has no next step to generate (drain, which flatters them).
Throughput is therefore measured between optimizer-step ends a = min(steps // 3, steps - 3)
and b = steps - 2 (`window`):
    step_s = (t_opt[b] - t_opt[a]) / (b - a),   throughput = samples_per_step / step_s
(default 12 steps: a window of 6, two cycles of 3; 3 steps: the second step alone, which the
planner uses for lag-0 modes, whose steps all start from the same idle state). With steps < 3
the whole run is the window.

The window is charged the work of the steps it measures. Modes that generate ahead (TCSS,
one-step-off) may enter the window with generation done for its steps before t0 (a lead
built while the pipeline filled) and leave it with less: the window's wall time then
undercounts those steps. Their GPU-seconds W_steps (every unit of steps a+1..b, whole) and
the GPU-seconds inside the window W_in differ by what the lead shrank or grew, and
    step_s = max over device types d of (t1 - t0 + (W_steps[d] - W_in[d]) / GPUs[d]) / (b - a)
spreads that difference over the GPUs of the device type that did the work, as if the
window had done it at no loss. Then step_s >= W_steps[d] / GPUs[d] / (b - a) for every d:
the steps' actual placement of work on device types, whose fluid version the ideal bound
minimises, so step_s >= the ideal bound and no mode can exceed 100% of it by borrowing work
done before the window; a mode in a true steady state (same lead at both ends) is unchanged.
Per device type, not over all GPUs: on a heterogeneous testbed the rollout GPUs may grow
their lead inside the window while the trainers bound the step; spreading that negative
difference over the trainers too read up to 103% of the ideal (tests/sim/test_ideal_bound.py).
One device type (every homogeneous testbed): the same number as one sum over all GPUs.
The breakdown is W_steps per kind. Bubbles use the window's wall time.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Optional

from digenrl.config.contract import contract
from digenrl.sched import Scheduler
from digenrl.sim.catalogue import get_judge, get_model
from digenrl.sim.costs import CostModel, JudgeServing, default_cost_model
from digenrl.sim.devices import get_device
from digenrl.sim.durations import DurationFn
from digenrl.sim.engine import run_virtual
from digenrl.sim.testbed import Testbed
from digenrl.io.trace import Trace, pool_time, staleness
from digenrl.sim.workload import RunSpec, config_for, duration_fn

KINDS = ("generate", "reward", "train", "optimizer", "sync")

# row -> (scheduler mode, colocated style)
ROWS = {
    "colocated-ideal": ("colocated", "colocated-ideal"),
    "verl-omni": ("colocated", "verl-omni"),
    "genrl": ("colocated", "genrl"),
    "flow_grpo": ("colocated", "flow_grpo"),
    "disagg-sync": ("disagg-sync", None),
    "one-step-off": ("one-step-off", None),
    "gap": ("gap", None),
    "gap+tsp": ("gap+tsp", None),
    "gap+tsp+tag": ("gap+tsp+tag", None),
    "digenrl": ("digenrl", None),
}
ALL = tuple(ROWS)


@dataclass
class RunResult:
    spec: RunSpec
    testbed: str
    n_gpus: int
    step_s: float  # steady-state seconds per RL step
    throughput: float  # trained samples per second (steady state)
    images_per_s_per_gpu: float
    usd_per_hour: float
    samples_per_usd: float
    bubble: dict  # pool -> idle fraction over the steady window
    staleness_max: int
    breakdown_s: dict  # per RL step: GPU-seconds / GPUs per kind + overhead + comm (+ judge: a generative judge's decode) + idle (sums to step_s)
    overhead_ws: dict  # baseline costs and exposed gang collectives (gang_*), GPU-seconds per step
    colocated_config: Optional[str] = None
    trace: Optional[Trace] = field(default=None, repr=False)
    fn: Optional[DurationFn] = field(default=None, repr=False)

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("trace", "fn", "spec")}
        d["mode"] = self.spec.mode
        d["knobs"] = self.spec.knobs()
        return d


def run_spec(tb: Testbed, spec: RunSpec, steps: int = 4, cm: CostModel | None = None,
             keep_trace: bool = False, check_memory: bool = True) -> RunResult:
    """Simulate `steps` RL steps of `spec` on `tb` and measure the steady state. A plan whose
    memory does not fit raises ValueError with the figure (check_memory=False: a shipped peer's
    published recipe is simulated anyway, durations.DurationFn.check_memory)."""
    cm = cm or default_cost_model()
    cfg, run, fn = spec_duration_fn(tb, spec, steps, cm, check_memory)
    trace = run_virtual(Scheduler(run.sched, fn.layout.workers), fn)  # run.workers(), made once (durations.layout)
    return measure(tb, spec, trace, fn, steps, keep_trace)


def spec_duration_fn(tb: Testbed, spec: RunSpec, steps: int, cm: CostModel, check_memory: bool = True):
    """(Config, contract, DurationFn) of `spec` on `tb`: what the simulator and the emulated
    runtime (digenrl.tools.bench.emulate_spec) both run."""
    cfg, run = _config_and_contract(tb, spec, steps)
    fn = duration_fn(cfg, tb, cm, run, style=spec.style, zero_baseline=spec.zero_baseline, memory=spec.memory,
                     check_memory=check_memory)
    return cfg, run, fn


@functools.lru_cache(maxsize=4096)
def _config_and_contract(tb: Testbed, spec: RunSpec, steps: int):
    """config_for and its contract, once per point: the planner asks for a point's bound and then
    its run, and building a Config (typed, validated) costs as much as simulating a small one.
    Callers only read them (a new DurationFn and Scheduler are made per run)."""
    cfg = config_for(tb, spec, steps)
    return cfg, contract(cfg)


ON_POLICY = ("colocated", "disagg-sync", "gap", "gap+tsp", "gap+tsp+tag")  # lag 0: nothing generated ahead


@dataclass(frozen=True)
class Bound:
    """Lower bounds on a point's measured step time (point_bound). `step_s`: on the whole step;
    `trainer_step_s`: on every RL step's wall time (its training and optimizer work on the
    trainer GPUs; lag 0 on one device type: all its work on every GPU); `other_s`: work of other
    steps the window may hold, per GPU of the device type (subtracted from the window's wall
    time, see point_bound)."""

    step_s: float
    trainer_step_s: float
    other_s: float

    def after(self, steps: int, c: int, elapsed: float) -> float:
        """The bound once optimizer step c (>= the window's first, a) ended `elapsed` seconds
        after the window opened: every step left to the window's last, b, takes trainer_step_s."""
        a, b = window(steps)
        return (elapsed + (b - c) * self.trainer_step_s - self.other_s) / (b - a)


def point_bound(tb: Testbed, spec: RunSpec, steps: int, cm: CostModel, ideal: float | None = None) -> Bound:
    """Lower bounds on run_spec(tb, spec, steps).step_s from the work the point must do, without
    simulating it (the planner prunes with them; tests/sim/test_planner.py holds them below every run).

    measure() gives step_s * n = (t1 - t0) + (W_steps - W_in) / N per device type (module doc).
      all work    W_steps >= the useful work (report.useful_work: the ideal's batching is the
                  cheapest) + every trainer GPU's OptimizerStep (reduction, AdamW on its shard,
                  publishing); W_in <= N (t1 - t0), so step_s >= W_steps / (N n)
      trainers    step s trains only after optimizer step s-1 ends and before optimizer step s
                  ends, so each step's training and optimizer work lies between the two: every
                  step takes >= (train + T opt) / T. The window holds no other step's work but
                  the syncs of the version it starts with (R of them) and, in lag-1 modes, step
                  b+1's generation (at most one step of Generate and Reward units, each priced
                  where it costs most), so step_s >= (train + T opt) / T - (syncs + that) / (N n)
      lag 0       (ON_POLICY's modes, and digenrl without TCSS: run.sched.lag) on one device type:
                  a step's Generate, Reward, Train and OptimizerStep units all run between the
                  optimizer step before it and its own, so every step, not only the window's
                  mean, takes >= all its work / N (trainer_step_s, which the early stop charges
                  each step left)
      rollout     lag-0 modes without TAG: the same for generation on the R rollout GPUs
    Raises ValueError where the point cannot run (as run_spec would)."""
    cfg, run, fn = spec_duration_fn(tb, spec, steps, cm)
    a, b = window(steps)
    n_win = b - a
    lay = fn.layout
    trainers = [w for w in lay.workers if w.role in ("trainer", "colocated")]
    rollout = [w for w in lay.workers if w.role == "rollout"]
    t_gpus = sum(lay.gpus.get(w.id, 1) for w in trainers)
    r_gpus = sum(lay.gpus.get(w.id, 1) for w in rollout)
    dev_t = fn.trainer_device
    opt = fn._opt(dev_t)
    u_t = useful_work(tb, dev_t, cm)
    bound = ideal if ideal is not None else ideal_step_s(tb, cm)["step_s"]
    one_type = len({lay.device[w.id] for w in lay.workers}) == 1
    n_dev = lay.n_gpus if one_type else t_gpus
    lag0 = run.sched.lag == 0  # ON_POLICY's modes, and digenrl without TCSS
    every = (sum(u_t.values()) - u_t["optimizer"] + t_gpus * opt) / lay.n_gpus if one_type else 0.0
    bound = max(bound, every)
    other = r_gpus * fn._sync(lay.device[rollout[0].id]) if rollout else 0.0
    if not lag0:
        other += _step_generation_max(fn, run, trainers, rollout)
    if not one_type and lag0:  # trainers on a device type of their own, lag 0
        other = 0.0
    # every step runs at least one Train unit, then every trainer's OptimizerStep (the barrier); a
    # lag-0 step also generates and scores a whole trajectory after the version it needs exists
    chain = _chain_s(fn, run, trainers, rollout, lag0)
    per_step = max((u_t["train"] + t_gpus * opt) / t_gpus, chain + opt, every if lag0 else 0.0)
    bound = max(bound, per_step - other / n_dev / n_win)
    if rollout and spec.mode in ("disagg-sync", "gap", "gap+tsp"):
        u_r = useful_work(tb, lay.device[rollout[0].id], cm)
        bound = max(bound, (u_r["generate"] + u_r["encode"] + u_r["reward"]) / r_gpus
                    - (other / lay.n_gpus / n_win if one_type else 0.0))
    return Bound(bound, per_step, other / n_dev)


def run_spec_within(tb: Testbed, spec: RunSpec, steps: int, cm: CostModel, incumbent: float,
                    bound: Bound | None, check_memory: bool = True):
    """run_spec, stopped as soon as the point's bound (Bound.after, once its window opened) shows
    its step time cannot be below `incumbent` (bound None: never): returns the RunResult, or the
    bound it reached.

    A lag-0 run (run.sched.lag 0) also stops once its window has closed (optimizer step b) and
    the weight syncs of the version step b made have ended (`run_virtual(until_synced=)`): those
    syncs are step b's work, and no unit of a later step starts before that version exists, so
    nothing else after optimizer step b weighs in measure(): the same step time, throughput and
    bubbles as the whole run, to the bit (tests/sim/test_planner.py). Its breakdown is per step
    of the steps it ran."""
    cfg, run, fn = spec_duration_fn(tb, spec, steps, cm, check_memory)
    a, b = window(steps)
    limit = incumbent * (1 + 1e-9)
    t0 = [0.0 if a < 0 else None]
    reached = [None]

    def on_version(version: int, now: float) -> bool:
        c = version - 1  # optimizer step c just ended
        if c == a:
            t0[0] = now
        if bound is None or t0[0] is None or not a <= c <= b:  # after b: the drain, outside the window
            return False
        lb = bound.after(steps, c, now - t0[0])
        if lb >= limit:
            reached[0] = lb
            return True
        return False

    trace = run_virtual(Scheduler(run.sched, fn.layout.workers), fn, on_version=on_version,
                        until_synced=b + 1 if run.sched.lag == 0 else None)
    if reached[0] is not None:
        return reached[0]
    return measure(tb, spec, trace, fn, steps)


def _chain_s(fn: DurationFn, run, trainers: list, rollout: list, generate: bool) -> float:
    """The shortest unit chain inside one RL step: the cheapest Train unit (its smallest sample
    shard, fewest trained steps, parameters already gathered), and with `generate` before it the
    cheapest whole trajectory of the smallest Generate shard and the cheapest Reward."""
    from digenrl.sched.units import Generate, Reward, Train, partition, split_rows

    c = run.sched
    mbs = partition(c.groups_per_step, c.micro_batch_groups)
    small = min(mbs, key=len)
    trained = c.trained(0)
    chunk = min(c.tsp_chunk, len(trained)) if c.tsp else len(trained)
    last = len(trained) % chunk or chunk  # the last chunk may be shorter

    def cheapest(unit, workers) -> float:
        costs = []
        for w in workers:
            for gathered in (False, True):
                fn._gathered = {w.id: gathered}
                costs.append(fn(w, unit))
        return min(costs)

    rows = min(split_rows(len(small) * c.samples_per_group, c.train_shard), key=lambda r: (r[1] - r[0]) if r else 1e9)
    t = cheapest(Train(0, 0, small, tuple(trained[:min(chunk, last)]), 0, rows), trainers[:1])
    if generate:
        gen_rows = min(split_rows(len(small) * c.samples_per_group, c.gen_shard),
                       key=lambda r: (r[1] - r[0]) if r else 1e9)
        gens = rollout[:1] + (trainers[:1] if c.tag or c.colocated else [])
        t += cheapest(Generate(0, 0, small, 0, 0, c.num_steps, gen_rows), gens)
        t += cheapest(Reward(0, 0, small, gen_rows), gens)  # GAP: the fragment is scored on its own
    fn._gathered = {}
    return t


def _step_generation_max(fn: DurationFn, run, trainers: list, rollout: list) -> float:
    """GPU-seconds of one RL step's Generate (whole trajectories) and Reward units, each at the
    most it can cost on any worker that may run it (a trainer gang's gathers not yet done)."""
    from digenrl.sched.units import Generate, Reward, partition, split_rows

    c = run.sched
    workers = ([rollout[0]] if rollout else []) + ([trainers[0]] if c.tag and trainers else [])
    total = 0.0
    for mb, groups in enumerate(partition(c.groups_per_step, c.micro_batch_groups)):
        units = [Generate(0, mb, groups, 0, 0, c.num_steps, rows)
                 for rows in split_rows(len(groups) * c.samples_per_group, c.gen_shard)] + [Reward(0, mb, groups)]
        for u in units:
            costs = []
            for w in workers:
                fn._gathered = {}
                costs.append(fn(w, u) * fn.layout.gpus.get(w.id, 1))
            total += max(costs, default=0.0)
    return total


def window(steps: int) -> tuple[int, int]:
    """(a, b): the steady window runs from optimizer step a's end to step b's and measures
    steps a+1..b (module doc). At least one step fills and the last drains: a = min(steps // 3,
    steps - 3), b = steps - 2; fewer than 3 steps: the whole run (a = -1, b = steps - 1)."""
    if steps >= 3:
        return min(steps // 3, steps - 3), steps - 2
    return -1, steps - 1


def steady_window(trace: Trace, steps: int) -> tuple[float, float, int]:
    """(t0, t1, RL steps between them): optimizer-step ends a and b of `window`, or the whole
    run when steps < 3 (see the module doc)."""
    t0, t1, a, b = _window(trace, steps)
    return t0, t1, b - a


def _window(trace: Trace, steps: int) -> tuple[float, float, int, int]:
    """(t0, t1, a, b): the window's times and its steps a+1..b (`window`; a = -1: the whole run)."""
    opt_end: dict[int, float] = {}
    for s in trace.spans:
        if s.kind == "optimizer":
            opt_end[s.step] = max(opt_end.get(s.step, 0.0), s.end)
    a, b = window(steps)
    return (opt_end[a] if a >= 0 else 0.0), opt_end[b], a, b


def measure(tb: Testbed, spec: RunSpec, trace: Trace, fn: DurationFn, steps: int,
            keep_trace: bool = False) -> RunResult:
    t0, t1, a, b = _window(trace, steps)
    n_steps = b - a
    n = fn.layout.n_gpus  # GPUs: a trainer gang holds several
    busy = {k: 0.0 for k in KINDS}  # W_steps per kind: whole units of steps a+1..b
    gpus, device = fn.layout.gpus, fn.layout.device
    # Per device type d: GPUs[d], W_steps[d] - W_in[d] (GPU-seconds; W_in: inside [t0, t1],
    # whichever step they belong to)
    n_dev: dict[str, int] = {}
    lead: dict[str, float] = {}
    for w in fn.layout.workers:
        n_dev[device[w.id]] = n_dev.get(device[w.id], 0) + gpus.get(w.id, 1)
        lead.setdefault(device[w.id], 0.0)
    # One pass over the spans (a 4096-GPU run holds ~40,000): GPU-seconds (a gang's span
    # occupies all its GPUs), and each pool's busy time inside the window (bubble_ratio's sum,
    # in the same order). min/max written out: the same values (first of equals, as min/max).
    inside: dict[str, list] = {p: [] for p in set(trace.workers.values())}
    # (GPUs, device, pool) of each worker: the layout's (made once per layout), a joined one's here
    per = fn.layout.weights
    if not trace.workers.keys() <= per.keys():
        per = {w: (gpus.get(w, 1), device.get(w), p) for w, p in trace.workers.items()}
    # Runs of spans alike but for the worker (a wave: one unit object, one start and end) on
    # workers alike to it (GPUs, device, pool) are weighed at once, with the same float operations
    # in the same order, one span after the other
    spans = trace.spans
    i, n_spans = 0, len(spans)
    while i < n_spans:
        s = spans[i]
        start, end, step, unit = s.start, s.end, s.step, s.unit
        here = per[s.worker]
        g, d, into = here[0], here[1], inside[here[2]]
        o = (t1 if t1 < end else end) - (t0 if t0 > start else start)
        o = o if o > 0.0 else 0.0  # max(0.0, o)
        j = i + 1
        if unit is not None and j < n_spans and spans[j].unit is unit:  # how far the run goes
            while (j < n_spans and (x := spans[j]).unit is unit and x.start == start and x.end == end
                   and x.step == step and ((q := per[x.worker]) is here or q == here)):
                j += 1
        k, i = j - i, j
        x, lo = lead[d], o * g
        if step is not None and a < step <= b:
            y = (end - start) * g
            w = busy[s.kind]
            for _ in range(k):
                x -= lo
                x += y
                w += y
            busy[s.kind] = w
        else:
            for _ in range(k):
                x -= lo
        lead[d] = x
        if k == 1:
            into.append(o)
        else:
            into.extend([o] * k)
    step_s = max(t1 - t0 + lead[d] / n_dev[d] for d in n_dev) / n_steps  # see the module doc
    # GPU-seconds per step (all steps alike), over the steps run (one stopped as its window closed,
    # run_spec_within, ran steps 0..b and the next one's start)
    ran = b + 1 if trace.stopped else steps
    over = {k: v / ran for k, v in fn.overhead_ws.items()}
    bd = {k: v / n_steps / n for k, v in busy.items()}
    # Baseline overheads and exposed gang collectives were inside units: their own columns.
    where = {"fsdp_gather": "generate", "recompute_logp": "train", "phase_switch": "optimizer",
             "offload_reload": "optimizer", "gang_train": "train", "gang_generate": "generate",
             # the shipped systems' mechanisms (shipped.py)
             "cfg_two_calls": "generate", "cfg_two_calls_train": "train", "encode_per_sample": "generate", "decode_serial": "reward",
             "rollout_sleep_wake": "optimizer", "weight_gather": "optimizer", "param_offload": "optimizer",
             "optimizer_offload": "optimizer", "reward_moves": "optimizer", "extra_optimizer": "optimizer",
             "gang_reduce": "optimizer", "gang_backward_reduce": "train", "driver_dispatch": "optimizer",
             "gang_sp_generate": "generate", "gang_sp_train": "train", "park": "optimizer",
             "reload": "train", "gang_recompute": "train", "judge_decode": "optimizer",
             # TAG's switches (durations._tag_switch): into the helper inside a Generate, back
             # inside the Train or OptimizerStep that follows it
             "tag_switch_in": "generate", "tag_switch_out": "train", "tag_switch_out_opt": "optimizer",
             # trajectory rows through the object store (durations._traj_setup): comm
             "trajectory_ship": "generate", "trajectory_resume": "generate", "trajectory_pull": "train"}
    for k, v in over.items():
        # a generative judge's decode (shipped.step_costs) is a column of its own: "judge"
        col = "comm" if k.startswith(("gang_", "trajectory_")) else "judge" if k == "judge_decode" else "overhead"
        bd[where[k]] -= v / n
        bd[col] = bd.get(col, 0.0) + v / n
    bd.setdefault("overhead", 0.0)
    bd.setdefault("comm", 0.0)
    bd["idle"] = max(0.0, step_s - sum(bd.values()))
    pools = sorted(set(trace.workers.values()))
    usd = sum(get_device(fn.layout.device[w.id]).usd_per_hour * fn.layout.gpus.get(w.id, 1)
              for w in fn.layout.workers)
    thr = tb.samples_per_step / step_s
    st = staleness(trace)
    return RunResult(spec, tb.name, n, step_s, thr, thr / n, usd, thr * 3600 / usd,
                     {p: _bubble(trace, p, t0, t1, inside.get(p, ())) for p in pools}, max(st.values(), default=0),
                     bd, over, fn.colocated_config, trace if keep_trace else None, fn if keep_trace else None)


def _bubble(trace: Trace, pool: str, t0: float, t1: float, busy: list) -> float:
    """trace.bubble_ratio(trace, pool, t0, t1), given the overlaps of the pool's spans with
    [t0, t1] in span order (measure's one pass; t0 <= t1 <= trace.end)."""
    total = pool_time(trace, pool, t0, t1)
    if total <= 0:
        return 0.0
    return max(0.0, 1.0 - sum(busy) / total)


# ----------------------------------------------------------------------------- ideal bound


def _batched(f, n: int, b: int) -> float:
    """Cost of n samples processed in batches of b (the last batch may be smaller)."""
    full, rest = divmod(n, b)
    return full * float(f(b)) + (float(f(rest)) if rest else 0.0)


def useful_work(tb: Testbed, device: str, cm: CostModel | None = None) -> dict:
    """GPU-seconds of useful work in one RL step if all of it ran on `device`.

    generate  every sample's denoising steps, in forwards of rollout_batch (CFG included)
    encode    one text-encoder pass per prompt
    reward    VAE decode + reward model, in batches of rollout_batch (a judge: + one decode of the
              step's longest answer)
    train     every trained (sample, step) pair, packed micro_batch to a pass (learner.passes; with `kl`,
              + the reference policy's no-grad forward the KL term needs; with `old_forward`,
              + DiffusionNFT's old-policy forward; dpo: the rows of its pairs only)
    optimizer one fused AdamW step over the trainable parameters (once, however sharded)
    Not useful (so not here): collectives, weight syncs, phase switches, offload/reload,
    recomputed log-probs, waiting.
    """
    cm = cm or default_cost_model()
    n, m = tb.samples_per_step, tb.model
    trainable = cm.lora_params_B(m, tb.lora_rank) if tb.lora else get_model(m).params_B
    return {
        "generate": tb.denoise_steps * _batched(lambda b: cm.denoise_s(m, device, b, tb.cfg, tb.shape), n,
                                                tb.rollout_batch),
        "encode": float(cm.text_encode_s(m, device, tb.groups_per_step)),
        # a generative judge: prefill in batches, the step's answers decoded together (their longest)
        "reward": _batched(lambda b: cm.reward_s(m, device, b, tb.reward, tb.shape, JudgeServing.of(tb, False)), n,
                           tb.rollout_batch)
        + (float(cm.judge_decode_s(tb.reward, device, n, JudgeServing.of(tb))) if get_judge(tb.reward) else 0.0),
        "train": _batched(
            lambda b: float(cm.train_s(m, device, b, tb.grad_ckpt, tb.lora, tb.train_cfg, tb.shape))
            + (float(cm.denoise_s(m, device, b, tb.train_cfg, tb.shape)) if tb.kl else 0.0)
            + (float(cm.denoise_s(m, device, b, tb.train_cfg, tb.shape)) if tb.old_forward else 0.0),
            tb.trained_rows(n) * tb.trained_steps, tb.micro_batch),
        "optimizer": float(cm.optimizer_step_s(trainable, device)),
    }


def ideal_step_s(tb: Testbed, cm: CostModel | None = None) -> dict:
    """The ideal bound: seconds per RL step with every GPU busy on useful work only.

    Homogeneous: T* = (useful GPU-seconds per step) / (number of GPUs).
    Heterogeneous: the fluid version of the same thing, the smallest T such that the useful
    work can be cut into pieces (any fraction of any kind) and placed so that no GPU works
    longer than T, where a piece of kind k on device d costs useful_work(d)[k]. Generation,
    encoding and rewards may run on any GPU (TAG lets trainers generate); training and the
    optimizer only on trainer (or split) pools. Computed exactly for the two-phase shape:
    trainer-only work goes on trainer-capable GPUs first, generation fills the rest in order
    of comparative advantage, bisection on T.
    Returns {"step_s", "work": {device: {kind: s}}, "gpus": {device: count}}.
    """
    cm = cm or default_cost_model()
    gpus: dict[str, int] = {}
    train_ok: dict[str, bool] = {}
    for p in tb.pools:
        gpus[p.device] = gpus.get(p.device, 0) + p.count
        train_ok[p.device] = train_ok.get(p.device, False) or p.role in ("trainer", "any")
    work = {d: useful_work(tb, d, cm) for d in gpus}
    gen_k, train_k = ("generate", "encode", "reward"), ("train", "optimizer")
    if len(gpus) == 1:
        (d, n), = gpus.items()
        return {"step_s": sum(work[d].values()) / n, "work": work, "gpus": gpus}
    trainers = [d for d in gpus if train_ok[d]]
    gen = {d: sum(work[d][k] for k in gen_k) for d in gpus}
    train = {d: sum(work[d][k] for k in train_k) for d in trainers}

    def feasible(T: float) -> bool:
        # Training on trainer-capable devices, fastest first (by train cost), then generation
        # into the leftover capacity, devices most efficient at generation first.
        cap = {d: gpus[d] * T for d in gpus}
        left = 1.0
        for d in sorted(trainers, key=lambda d: train[d] / gen[d]):
            x = min(left, cap[d] / train[d])
            cap[d] -= x * train[d]
            left -= x
        if left > 1e-12:
            return False
        g = 1.0
        for d in sorted(gpus, key=lambda d: gen[d]):
            g -= min(g, cap[d] / gen[d])
        return g <= 1e-12

    lo, hi = 0.0, sum(gen.values()) + sum(train.values())
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return {"step_s": hi, "work": work, "gpus": gpus}


# ----------------------------------------------------------------------------- the report

COLS = ("generate", "reward", "train", "optimizer", "sync", "overhead", "comm", "idle")
LABELS = {"verl-omni": "verl-omni (shipped)", "genrl": "genrl (shipped)", "flow_grpo": "flow_grpo (shipped)"}
IDEAL_ROW = "colocated-ideal"


@dataclass
class Report:
    """Every mode on one testbed (see simulate.simulate). `rows[label]` are RunResults."""

    testbed: Testbed
    reference: Optional[Testbed]  # same-budget homogeneous cluster for colocated rows (hetero only)
    steps: int
    rows: dict
    ideal_s: dict  # testbed name -> ideal seconds per RL step (ideal_step_s)
    decomposition: dict  # baseline -> {"total", "per_dollar", "factors", "shares", "note"}
    plans: dict
    gantt: dict = field(default_factory=dict)  # label -> PNG path (after write)
    unfit: dict = field(default_factory=dict)  # label -> why no plan of that row runs (memory figure)

    def utilisation(self, label: str) -> float:
        """Ideal seconds per step / simulated seconds per step, on the cluster the row ran on."""
        r = self.rows[label]
        return self.ideal_s[r.testbed] / r.step_s

    def vs_colocated(self, label: str) -> Optional[float]:
        """Throughput ratio to the colocated-ideal row; per dollar if the clusters differ."""
        if IDEAL_ROW not in self.rows:
            return None
        r, c = self.rows[label], self.rows[IDEAL_ROW]
        if r.testbed != c.testbed:
            return r.samples_per_usd / c.samples_per_usd
        return r.throughput / c.throughput

    def to_dict(self) -> dict:
        rows = {}
        for k, r in self.rows.items():
            d = r.to_dict()
            d.update(utilisation=self.utilisation(k), vs_colocated=self.vs_colocated(k))
            rows[k] = d
        return {"testbed": self.testbed.name, "n_gpus": self.testbed.n_gpus, "model": self.testbed.model,
                "reference": self.reference.name if self.reference else None, "steps": self.steps,
                "ideal_step_s": self.ideal_s, "rows": rows, "decomposition": self.decomposition,
                "plans": self.plans, "gantt": self.gantt, "unfit": self.unfit}

    def table(self) -> str:
        tb = self.testbed
        lines = [f"== {tb.name}: {tb.model}, {tb.n_gpus} GPUs ({', '.join(f'{p.count}x {p.device} {p.role}' for p in tb.pools)}), "
                 f"{tb.samples_per_step} samples/step; ideal {self.ideal_s[tb.name]:.2f} s/step"]
        if self.reference:
            lines.append(f"   colocated rows on {self.reference.name} (same $/h), compared per dollar; "
                         f"ideal there {self.ideal_s[self.reference.name]:.2f} s/step")
        hdr = (f"{'mode':<22} {'GPUs':>4} {'s/step':>8} {'smp/s':>7} {'img/s/GPU':>9} {'smp/$':>7} {'vs ideal':>8} "
               f"{'util':>5} {'bubble':>17} {'stale':>5}  breakdown s/step " + "/".join(c[:4] for c in COLS))
        lines += [hdr, "-" * len(hdr)]
        for k in self.order():
            if k in self.unfit:
                lines.append(f"{LABELS.get(k, k):<22} does not fit: {self.unfit[k]}")
                continue
            r = self.rows[k]
            vs = self.vs_colocated(k)
            bub = " ".join(f"{p[0]}{v:.2f}" for p, v in r.bubble.items())
            bd = "/".join(f"{r.breakdown_s.get(c, 0.0):.1f}" for c in COLS)
            lines.append(f"{LABELS.get(k, k):<22} {r.n_gpus:>4} {r.step_s:>8.2f} {r.throughput:>7.3f} "
                         f"{r.images_per_s_per_gpu:>9.4f} {r.samples_per_usd:>7.0f} "
                         f"{'-' if vs is None else f'{vs:.2f}x':>8} {100 * self.utilisation(k):>4.0f}% {bub:>17} "
                         f"{r.staleness_max:>5}  {bd}")
        for k, p in self.plans.items():  # what each DigenRL row runs, as the config keys that hold it
            if k == "digenrl":
                lines.append(f"digenrl plan: {self.plan_line(k)}")
        for base, d in self.decomposition.items():
            f = d["factors"]
            lines.append(f"digenrl vs {LABELS.get(base, base)}: {d['total']:.2f}x{' per $' if d['per_dollar'] else ''}"
                         f" = baseline costs {f['baseline_costs']:.2f} x heterogeneity {f['heterogeneity']:.2f}"
                         f" x scaling {f['independent_scaling']:.2f} x overlap {f['overlap']:.2f}"
                         + (f"  [< {1.56}x: {d['note']}]" if d["note"] else ""))
        return "\n".join(lines)

    def order(self) -> list[str]:
        """Row labels in the order they were asked for, rows that do not fit in their place."""
        return [k for k in ALL if k in self.rows or k in self.unfit]

    def plan_line(self, label: str) -> str:
        """The row's plan as config keys (RunSpec.overrides), or its colocated memory plan."""
        r = self.rows[label]
        where = self.reference if (r.spec.mode == "colocated" and self.reference is not None) else self.testbed
        keys = " ".join(f"{k}={v}" for k, v in r.spec.overrides(where).items())
        return keys + (f"  (memory plan: {r.colocated_config})" if r.spec.mode == "colocated" else "")

    def write(self, out_dir, gantt_modes=None) -> None:
        """report.json + one Gantt PNG per row (a steady-state RL step; `gantt_modes` limits
        which rows get one: matplotlib takes ~1-2 s per figure) into out_dir."""
        from pathlib import Path
        import json
        from digenrl.io.trace import plot_gantt
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        step = self.steps // 2
        for k, r in self.rows.items():
            if r.trace is not None and (gantt_modes is None or k in gantt_modes):
                p = out / f"gantt-{self.testbed.name}-{k.replace('+', '_')}.png"
                plot_gantt(r.trace, str(p), step=min(step, self.steps - 1))
                self.gantt[k] = str(p)
        (out / f"report-{self.testbed.name}.json").write_text(json.dumps(self.to_dict(), indent=1))
