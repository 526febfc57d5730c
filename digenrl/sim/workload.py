"""The simulator speaks the runtime's vocabulary: a planned run is a Config.

    Testbed + RunSpec --config_for--> Config  (what `digenrl plan` writes, `digenrl train` runs)
    Config + Testbed  --testbed_for-> Testbed (the testbed's hardware and model costs, the
                                               Config's pools and workload)
    Config + Testbed  --duration_fn-> DurationFn on the Config's contract workers

The schedule of a simulated, emulated or real run is always `digenrl.config.contract.contract(cfg)`:
the simulator never builds a SchedConfig of its own. A testbed the runtime cannot express
(e.g. every denoising step trained, which no SDE window allows) is refused here with the
Config key that cannot hold it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional

from digenrl.config.errors import ConfigError
from digenrl.config.schema import Config, load_config
from digenrl.models.families import FAMILIES
from digenrl.config.contract import RunContract, contract, trained_steps
from digenrl.math.payload import reads_of
from digenrl.rewards import REWARD_NAMES
from digenrl.sched import TSP_MODES
from digenrl.sim.catalogue import family_of, get_model
from digenrl.sim.costs import CostModel
from digenrl.sim.durations import DurationFn, make_duration_fn
from digenrl.sim.sp import check_degree, degrees
from digenrl.sim.testbed import Testbed, resize

CFG_SCALE = 4.5  # a guidance scale > 1 (the testbed only says "CFG on"); flow_grpo's SD3 default
KL_BETA = 0.04  # likewise for "KL on": flow_grpo's default beta
NFT_DECAY = 0.5  # "old policy kept" (old_forward): DiffusionNFT's decay type 1 cap, train.nft_decay


@dataclass(frozen=True)
class RunSpec:
    """The knobs of one run (None = not used by this mode)."""

    mode: str
    n_rollout: Optional[int] = None  # rollout GPUs when the testbed's pool is split (role any)
    micro_batch_groups: int = 1  # scheduler groups per micro-batch
    samples_per_group: Optional[int] = None  # samples per scheduler group (None: group_size)
    tsp_chunk: Optional[int] = None  # TSP chunk; batch-level modes: trainers share the batch evenly
    tag_segment: Optional[int] = None
    gen_shard: Optional[int] = None  # Generate sample shards per micro-batch (SchedConfig.gen_shard)
    train_shard: Optional[int] = None  # Train sample shards per (micro-batch, chunk)
    gang: Optional[int] = None  # GPUs per trainer gang (None: the smallest that fits, workload.fitting_gang)
    rollout_gang: Optional[int] = None  # GPUs per rollout worker, sequence-parallel (None: the testbed's or 1)
    trainer_sp: Optional[int] = None  # sequence-parallel degree inside a trainer gang (None: the testbed's or 1)
    reshard: Optional[str] = None  # after-forward (None) | after-step
    offload: Optional[bool] = None  # runtime.trainer.offload: AdamW state on the host (None: off)
    memory: Optional[str] = None  # colocated rows: the memory plan (baselines.LAYOUTS; None: the cheapest that fits)
    style: Optional[str] = None  # colocated style: colocated-ideal | a shipped system (shipped.SYSTEMS)
    zero_baseline: bool = False
    packed: Optional[bool] = None  # TSP's packed passes (train.pairs_per_pass); None: the mode's default (`packs`)
    tcss_fraction: Optional[float] = None  # run.tcss_fraction: TCSS's stale share (None: off)
    tag_handback: Optional[bool] = None  # runtime.tag_handback (None: the default, true)

    def knobs(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and k not in ("mode", "zero_baseline")}

    def overrides(self, tb: Testbed) -> dict:
        """The knobs as the Config keys that hold them (what `digenrl plan` prints)."""
        cfg = config_for(tb, self, 1)
        rt, d = cfg.runtime, cfg.data
        out = {"run.mode": self.mode, "runtime.rollout.workers": rt.rollout.workers,
               "runtime.trainer.workers": rt.trainer.workers}
        if cfg.run.tcss_fraction:
            out["run.tcss_fraction"] = cfg.run.tcss_fraction
        if rt.rollout.gang > 1:
            out["runtime.rollout.gang"] = rt.rollout.gang
        if d.micro_batch_samples:
            out["data.micro_batch_samples"] = d.micro_batch_samples
        else:
            out["data.micro_batch_groups"] = d.micro_batch_groups
        t = rt.trainer
        if t.gang > 1:
            out.update({"runtime.trainer.gang": t.gang, "runtime.trainer.shard": t.shard,
                        "runtime.trainer.reshard": t.reshard})
        if t.offload:
            out["runtime.trainer.offload"] = True
        if t.sp > 1:
            out["runtime.trainer.sp"] = t.sp
        for key, value in (("train.tsp_chunk", cfg.train.tsp_chunk), ("train.pairs_per_pass", cfg.train.pairs_per_pass),
                           ("runtime.tag_segment", self.tag_segment),
                           ("runtime.gen_shard", self.gen_shard), ("runtime.train_shard", self.train_shard)):
            if value:
                out[key] = value
        return out


def family(model: str) -> str:
    """The model.name of a cost-model entry (e.g. 'flux.1-12b' -> 'flux', 'flux.1-kontext-12b'
    -> 'flux-kontext': the longest prefix, catalogue.family_of)."""
    name = family_of(model)
    if name is not None:
        return name
    raise ConfigError(f"model.name: the cost model's {model!r} has no runtime adapter; "
                      f"known families: {', '.join(FAMILIES)}")


def config_for(tb: Testbed, spec: RunSpec, steps: int, testbed_ref: Optional[str] = None) -> Config:
    """The Config that runs `spec` on `tb` for `steps` RL steps (emulated compute on the
    testbed's cost model; set runtime.compute=real and model.path for the real thing).

    `testbed_ref` is what runtime.testbed will say (a preset name or a YAML path; default
    tb.name, with '@N' resized presets written as the preset and the Config's pool sizes).
    """
    n = tb.n_gpus
    if spec.mode == "colocated":
        if not tb.split_pool:
            raise ConfigError(f"run.mode: colocated needs a testbed whose pools have role 'any'; "
                              f"{tb.name!r} fixes rollout/trainer pools")
        rollout, trainer = 0, n
    elif tb.split_pool:
        rollout = n // 2 if spec.n_rollout is None else spec.n_rollout
        trainer = n - rollout
    else:
        rollout = sum(p.count for p in tb.pool("rollout"))
        trainer = sum(p.count for p in tb.pool("trainer"))
        if spec.n_rollout is not None and spec.n_rollout != rollout:
            raise ValueError(f"n_rollout={spec.n_rollout}: testbed {tb.name!r} fixes the rollout pool size")
    spg = spec.samples_per_group
    if spg not in (None, 1, tb.group_size):
        raise ConfigError(f"data.micro_batch_samples: samples_per_group={spg} has no config key "
                          f"(1 = micro-batches of samples, or {tb.group_size} = whole groups)")
    per_sample = spg == 1 and tb.group_size > 1
    trained, usable = tb.trained_steps, tb.denoise_steps - 1
    if trained > usable:
        raise ConfigError(f"sampling.window_size: {tb.name!r} trains {trained} of {tb.denoise_steps} steps; "
                          f"an SDE window trains at most {usable} (the last step is always ODE)")
    rgang, sp = (1, 1) if spec.mode == "colocated" else degrees_of(tb, spec)
    for key, degree in (("runtime.rollout.gang", rgang), ("runtime.trainer.sp", sp)):
        why = check_degree(tb.model, degree, key)
        if why:
            raise ConfigError(why)
    if rollout % rgang:
        raise ConfigError(f"runtime.rollout.gang: {rollout} rollout GPUs do not split into gangs of {rgang}")
    offload = bool(spec.offload) and spec.mode != "colocated"
    gang = 1 if spec.mode == "colocated" else (spec.gang or fitting_gang(tb, trainer, after_step=spec.reshard == "after-step",
                                                                          sp=sp, offload=offload))
    if not gang:
        raise ConfigError(f"runtime.trainer.sp: {trainer} trainer GPUs hold no gang of a multiple of {sp} GPUs")
    if trainer % gang:
        raise ConfigError(f"runtime.trainer.gang: {trainer} trainer GPUs do not split into gangs of {gang}")
    if offload and gang == 1:  # the runtime offloads the sharded AdamW state (FSDP2 CPU offload)
        raise ConfigError("runtime.trainer.offload: offloads a sharded gang's optimizer state; needs "
                          f"runtime.trainer.gang >= 2 (shard=fsdp), and {trainer} trainer GPUs give a gang of 1")
    gangs = {"gang": gang, "shard": "fsdp" if gang > 1 else "none", "reshard": spec.reshard or "after-forward",
             **({"offload": True} if offload else {}), **({"sp": sp} if sp > 1 else {})}
    trainer //= gang
    rollout //= rgang
    dev = lambda p: {"num_gpus": 1, "num_cpus": 1, "accelerator": p.device}  # noqa: E731
    name = family(tb.model)
    kind = FAMILIES[name].conditioning
    if kind and tb.prompts is None:
        raise ConfigError(f"data.prompts: {name} is conditioned on a {kind} per prompt; the testbed "
                          f"{tb.name!r} names no rows file (its key 'prompts: FILE.jsonl')")
    rows = {"prompts": tb.prompts, "eval_prompts": tb.prompts} if tb.prompts else {}
    rpool = (tb.pool("rollout") or tb.pools)[0]
    tpool = (tb.pool("trainer") or tb.pools)[0]
    tree = {
        "model": {"name": name, "device": "cuda", "height": tb.height, "width": tb.width,
                  "frames": tb.frames if get_model(tb.model).kind == "video" else 0,
                  "lora_rank": tb.lora_rank if tb.lora else 0, "grad_ckpt": tb.grad_ckpt,
                  "dtype": "bfloat16"},
        "sampling": {"num_steps": tb.denoise_steps, "cfg_scale": CFG_SCALE if tb.cfg else 1.0,
                     **({"sde": "ode"} if tb.old_forward else {}),
                     **({"window_draw": tb.window_draw} if tb.window_draw != "step" else {}),
                     **({"window": "contiguous", "window_size": trained} if draws_window(tb)
                        else {"window": "all-but-last"})},
        "data": {**rows, "groups_per_step": tb.groups_per_step, "group_size": tb.group_size,
                 "micro_batch_groups": 1 if per_sample else min(spec.micro_batch_groups, tb.groups_per_step),
                 "micro_batch_samples": min(spec.micro_batch_groups, tb.samples_per_step) if per_sample else 0},
        "reward": {"weights": {tb.reward: 1.0}} if tb.reward in REWARD_NAMES else {},  # else: the default
        "train": {"steps": steps, "tsp_chunk": spec.tsp_chunk or 0, "beta": KL_BETA if tb.kl else 0.0,
                  **_passes(tb, spec), **_objective(tb)},
        "run": {"mode": spec.mode, **({"tcss_fraction": spec.tcss_fraction} if spec.tcss_fraction else {})},
        "runtime": {"compute": "emulated", "testbed": testbed_ref or tb.name.split("@")[0],
                    "weight_sync": tb.weight_sync,
                    "rollout": {"workers": rollout, **dev(rpool), **({"gang": rgang} if rgang > 1 else {})},
                    "trainer": {"workers": trainer, **dev(tpool), **gangs},
                    "tag_segment": spec.tag_segment or 1, "gen_shard": spec.gen_shard or 1,
                    **({"tag_handback": spec.tag_handback} if spec.tag_handback is not None else {}),
                    "train_shard": spec.train_shard or 1},
    }
    return load_config(None, tree=tree)


def draws_window(tb: Testbed) -> bool:
    """Whether `tb`'s runs draw their SDE window (sampling.window contiguous, from math.rng's
    generator, torch's): all but the last step trained leaves nothing to draw."""
    return tb.trained_steps != tb.denoise_steps - 1


def packs(spec: RunSpec) -> bool:
    """Whether a plan trains in TSP's packed passes (learner.passes): the TSP modes, and the
    colocated-ideal bound (a perfect colocated system would pack too); not the modes the
    ablation runs without TSP, nor a peer as it ships (their trainers loop over timesteps)."""
    if spec.packed is not None:
        return spec.packed
    return spec.mode in TSP_MODES or (spec.mode == "colocated" and spec.style in (None, "colocated-ideal"))


def _passes(tb: Testbed, spec: RunSpec) -> dict:
    """train keys of a pass: the testbed's micro_batch samples per trained step, or, packed,
    that many (sample, step) pairs (the same activation memory)."""
    if packs(spec):
        return {"pairs_per_pass": tb.micro_batch, "backward_batch": 0}
    return {"backward_batch": tb.micro_batch}


def _objective(tb: Testbed) -> dict:
    """train keys of the objective a testbed's workload flags imply, so that the Config a plan
    writes trains what the testbed prices (testbed_for reads them back): `old_forward` is
    DiffusionNFT keeping its old policy (train.loss=nft, DiffusionNFT's decay type 1, on ODE
    samples), `pair_rows` 2 Diffusion-DPO's best-worst pair (train.loss=dpo). Empty: grpo."""
    if tb.old_forward and tb.pair_rows:
        raise ConfigError(f"train.loss: testbed {tb.name!r} sets old_forward (nft) and pair_rows (dpo); pick one")
    implied = "final" if tb.old_forward or tb.pair_rows else "transitions"
    if tb.reads != implied:
        raise ConfigError(f"trajectory_reads: testbed {tb.name!r} ships {tb.reads!r} trajectories, but the "
                          f"objective its flags imply (old_forward, pair_rows) reads {implied!r}")
    if tb.old_forward:
        return {"loss": "nft", "nft_decay": NFT_DECAY}
    if tb.pair_rows:
        every = tb.group_size * (tb.group_size - 1)  # train.dpo_pairs=margin's bound (_pair_rows)
        if tb.pair_rows not in (2, every):
            raise ConfigError(f"train.dpo_pairs: testbed {tb.name!r} has pair_rows {tb.pair_rows}; allowed: 0, "
                              f"2 (best-worst), {every} (margin: every pair of a group of {tb.group_size})")
        # its reference forward is the loss's own (train.beta, the KL weight, stays 0), and a pair
        # trains in one pass (train.backward_batch 0): the schema's rules for train.loss=dpo
        return {"loss": "dpo", "beta": 0.0, "backward_batch": 0,
                **({"dpo_pairs": "margin"} if tb.pair_rows == every != 2 else {})}
    return {}


def degrees_of(tb: Testbed, spec: RunSpec) -> tuple[int, int]:
    """(runtime.rollout.gang, runtime.trainer.sp) of `spec` on `tb`: the spec's, else the
    testbed's fixed ones, else 1."""
    return (spec.rollout_gang or tb.rollout_gang or 1, spec.trainer_sp or tb.trainer_sp or 1)


def fitting_gang(tb: Testbed, trainer_gpus: int, cm: Optional[CostModel] = None, after_step: bool = False,
                 sp: Optional[int] = None, offload: bool = False) -> int:
    """The smallest gang (a divisor of the trainer GPUs, a multiple of the sequence-parallel
    degree sp, default the testbed's or 1) whose GPUs hold the training state (memory.py,
    FSDP over the gang, activations / sp, the AdamW state on the host with `offload`, which
    needs a gang of 2 or more); 1 when a replica fits. Nothing fits: the largest, which the
    duration function then refuses with the reason (0: no gang is a multiple of sp)."""
    return _fit(tb, trainer_gpus, cm, after_step, sp, offload)[0]


def trainer_fit(tb: Testbed, trainer_gpus: int, cm: Optional[CostModel] = None, after_step: bool = False,
                sp: Optional[int] = None, offload: bool = False, any_size: bool = False):
    """(gang, memory.FitReport) of the smallest fitting gang on `trainer_gpus` GPUs (`any_size`:
    of any size up to them, not only a divisor; the report None when no size is tried)."""
    return _fit(tb, trainer_gpus, cm, after_step, sp, offload, any_size)


def _fit(tb: Testbed, trainer_gpus: int, cm: Optional[CostModel], after_step: bool, sp: Optional[int],
         offload: bool = False, any_size: bool = False):
    from digenrl.sim.costs import default_cost_model

    cm = cm or default_cost_model()
    sp = sp or tb.trainer_sp or 1
    dev = (tb.pool("trainer") or tb.pools)[0].device
    sizes = [d for d in range(2 if offload else 1, max(1, trainer_gpus) + 1)
             if (any_size or trainer_gpus % d == 0) and d % sp == 0]
    if not get_model(tb.model).fsdp:  # no sharded gang (two experts): a replica or nothing
        sizes = [d for d in sizes if d == 1]
    rep = None
    for n in sizes:
        rep = cm.fits(tb.model, ["trainer"], dev, train_batch=tb.micro_batch, lora=tb.lora, grad_ckpt=tb.grad_ckpt,
                      cfg=tb.train_cfg, shape=tb.shape, lora_rank=tb.lora_rank, fsdp_shards=n,
                      after_step=after_step, gang=n > 1, sp=sp, offload=offload)
        if rep.fits:
            return n, rep
    return (sizes[-1] if sizes else 0), rep


def refusal(tb: Testbed, cm: Optional[CostModel] = None, memory: bool = False) -> Optional[str]:
    """Why no system can run `tb` (None: some can). Checked: the model has a runtime adapter,
    the testbed's sequence-parallel degrees are ones the model runs, and the workload is a valid
    Config. Memory is a row's business (each row says whether its plan fits, simulate.simulate),
    not the testbed's; with `memory=True` also refuse when even DigenRL's most memory-frugal plan
    cannot hold the training state: one trainer gang over every trainer-capable GPU, AdamW state
    on the host, generating under TAG (no rollout pool when the pool is split)."""
    split = tb.split_pool
    trainers = tb.n_gpus if split else sum(p.count for p in tb.pool("trainer"))
    try:
        family(tb.model)
        for key, degree in (("rollout_gang", tb.rollout_gang), ("trainer_sp", tb.trainer_sp)):
            why = check_degree(tb.model, degree or 1, key)
            if why:
                return why
        # the largest sequence-parallel degree the planner may pick holds the least per GPU
        gpn = (tb.pool("trainer") or tb.pools)[0].gpus_per_node
        sp = tb.trainer_sp or max(d for d in degrees(tb.model, min(trainers, gpn)) if trainers % d == 0)
        gang, rep = trainer_fit(tb, trainers, cm, sp=sp, offload=trainers > 1 and not tb.lora)
        if rep is None:
            return f"trainer_sp={sp}: {trainers} trainer GPUs hold no gang of a multiple of {sp} GPUs"
        if memory and not rep.fits:
            return (f"no trainer gang holds the {tb.model} training state: {rep.peak_gib:.0f} GiB per GPU even "
                    f"with FSDP over {gang} {rep.device} ({rep.usable_gib:.0f} GiB usable)")
        config_for(tb, RunSpec("digenrl", n_rollout=0 if split else None, gang=gang,
                               trainer_sp=sp if sp > 1 else None), 2)
    except ConfigError as e:
        return str(e)
    return None


def testbed_for(cfg: Config, tb: Testbed) -> Testbed:
    """`tb`'s devices, links and model costs with `cfg`'s pool sizes and workload."""
    if family(tb.model) != cfg.model.name:
        raise ConfigError(f"model.name: {cfg.model.name!r} but runtime.testbed {tb.name!r} models "
                          f"{tb.model!r} (model.name={family(tb.model)})")
    rt, d = cfg.runtime, cfg.data
    for key, degree in (("runtime.rollout.gang", rt.rollout.gang), ("runtime.trainer.sp", rt.trainer.sp)):
        why = check_degree(tb.model, degree, key)
        if why:
            raise ConfigError(why)
    rollout_gpus = 0 if cfg.run.mode == "colocated" else rt.rollout.workers * (rt.rollout.gang - 1)
    n = rt.rollout.workers + rollout_gpus + rt.trainer.workers * rt.trainer.gang  # GPUs
    if tb.split_pool:
        if n != tb.n_gpus and len(tb.pools) != 1:
            raise ConfigError(f"runtime.trainer.workers: {n} workers but testbed {tb.name!r} has "
                              f"{tb.n_gpus} GPUs in several pools")
        tb = resize(tb, n)
    else:
        for role in ("rollout", "trainer"):
            pool = getattr(rt, role)
            have, want = sum(p.count for p in tb.pool(role)), pool.workers * pool.gang
            if have != want:
                raise ConfigError(f"runtime.{role}.workers: {want} GPUs, but testbed {tb.name!r} has {have} "
                                  f"{role} GPUs (its pools are fixed)")
    sde = cfg.sampling
    return replace(tb, denoise_steps=sde.num_steps, trained_steps=len(trained_steps(cfg, 0)), group_size=d.group_size,
                   groups_per_step=d.groups_per_step, lora=cfg.model.lora_rank > 0,
                   lora_rank=cfg.model.lora_rank or tb.lora_rank, cfg=sde.guided,
                   # the KL reference, or Diffusion-DPO's (always): a no-grad forward per trained chunk
                   kl=cfg.train.beta > 0 or cfg.train.loss == "dpo", old_forward=cfg.train.nft_decay > 0,
                   grad_ckpt=cfg.model.grad_ckpt, pair_rows=_pair_rows(cfg),
                   trajectory_reads=reads_of(cfg.train.loss), window_draw=cfg.sampling.window_draw,
                   micro_batch=cfg.train.backward_batch or cfg.train.pairs_per_pass or tb.micro_batch,
                   weight_sync=rt.weight_sync)


def _pair_rows(cfg: Config) -> int:
    """Rows a prompt group trains under train.loss=dpo (learner._accumulate_pairs): 2 for its
    best-worst pair, every pair's 2 rows with margin (an upper bound: the pairs past the margin
    depend on the rewards); 0 (every sample) for the other objectives."""
    if cfg.train.loss != "dpo":
        return 0
    g = cfg.data.group_size
    return 2 if cfg.train.dpo_pairs == "best-worst" else g * (g - 1)


def duration_fn(cfg: Config, tb: Testbed, cm: CostModel, run: Optional[RunContract] = None, *,
                style: Optional[str] = None, zero_baseline: bool = False, memory: Optional[str] = None,
                check_memory: bool = True) -> DurationFn:
    """Seconds per unit for the workers of `cfg`'s contract on `tb`'s hardware (memory,
    check_memory: the colocated rows' layout and memory check, durations.DurationFn)."""
    run = run or contract(cfg)
    return make_duration_fn(testbed_for(cfg, tb), cm, run, style=style, zero_baseline=zero_baseline, memory=memory,
                            check_memory=check_memory)
