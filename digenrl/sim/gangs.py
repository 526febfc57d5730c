"""Trainer gangs: the FSDP layout of a model and the bytes of every collective a gang issues.

The runtime's contract (docs/design/step.md "Trainer gangs", docs/design/simulator.md "Trainer gangs: the
collectives charged to every row"; digenrl.learner.comm counts the same sums on the runtime side):

    model --layout--> FSDP units (one per transformer block + the root with the rest)
                      each unit: its parameters (dim0, rest, trainable)
          --per rank, gang of N, param dtype p bytes---------------------------------
          all-gather      N * sum_unit_params ceil(dim0/N) * rest * p          every param
          reduce-scatter  N * sum_trainable   ceil(dim0/N) * rest * 4          fp32 reduce
          cross-gang      4 * trainable tensors + g * sum_trainable ceil(dim0/N) * rest
                          (one fp32 mask element per trainable tensor + the local sums, g bytes
                          each: 8 or 4 by train.grad_sum, digenrl.math.grad_sum)
          publish gather  N * sum_payload ceil(dim0/N) * rest * p   payload_state's tensors: every
                          param (object-store), trainable only (lora-only, nccl under LoRA)
          relay send      trainable tensors (LoRA) or the full state dict, model dtype

    Config + Trace (what each gang ran) --predict_comm--> per RL step
          comm/<phase>/<kind>_bytes summed over every rank of every trainer gang

Which units issue what (measured on torch 2.13, gloo, tests/sim/test_gangs.py):
    reshard after-forward  every forward (grad or not) gathers every unit; every backward
                           gathers every unit again and reduce-scatters the trainable units
    reshard after-step     the first forward after a reshard gathers every unit once; the
                           optimizer step reshards; backward still reduce-scatters
    gang of 1              no FSDP collective (a group of one moves nothing)

The layout of the tiny DiT is read from the module itself, built on the meta device with
the config's LoRA, so the padding is exact; catalogue models (FLUX, SD3.5, Wan, Hunyuan,
Qwen-Image) split their parameter count evenly over their blocks (padding is negligible).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from digenrl.learner.passes import pass_count
from digenrl.math.kinds import AUTO_FLOAT64_PARAMS, grad_sum_bytes
from digenrl.sim.catalogue import get_model, lora_params_B

if TYPE_CHECKING:
    from digenrl.config.model import ModelConfig
    from digenrl.config.schema import Config
    from digenrl.io.trace import Trace

REDUCE_BYTES = 4  # gradients are reduced in fp32 (MixedPrecisionPolicy reduce_dtype)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PHASES = ("train", "generate", "publish", "sync")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "send", "all_to_all")  # all_to_all: sim.sp


def key(phase: str, kind: str) -> str:
    """The metrics.jsonl key of a (phase, kind) byte counter."""
    return f"comm/{phase}/{kind}_bytes"


@dataclass(frozen=True)
class Param:
    """One parameter tensor as FSDP2 shards it: along dim 0, each rank holding ceil(dim0/N) rows."""

    dim0: int
    rest: int  # product of the other dims (1 for a vector)
    trainable: bool

    def padded(self, n: int) -> int:
        """Elements of one rank's (padded) shard over a gang of n: ceil(dim0/n) * rest."""
        return -(-self.dim0 // n) * self.rest


@dataclass(frozen=True)
class FsdpUnit:
    """One fully_shard call: a transformer block, or the root holding the rest."""

    name: str
    params: tuple[Param, ...]

    def shard_numel(self, n: int, trainable_only: bool = False) -> int:
        return sum(p.padded(n) for p in self.params if p.trainable or not trainable_only)

    @property
    def trainable(self) -> bool:
        return any(p.trainable for p in self.params)


@dataclass(frozen=True)
class ModelLayout:
    """The FSDP units of a model and the byte counts of each collective over them."""

    name: str
    units: tuple[FsdpUnit, ...]
    param_bytes: int  # the gathered dtype: the model dtype (bf16 compute under mixed precision)
    payload_bytes: int  # one relay send: trainable tensors (LoRA) or the full state dict, model dtype
    # (method, n) -> bytes: the simulator asks per unit, millions of times per plan
    _memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def _cached(self, name: str, n: int, compute) -> int:
        key = (name, n)
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def numel(self) -> int:
        return sum(p.dim0 * p.rest for u in self.units for p in u.params)

    @property
    def trainable_numel(self) -> int:
        return sum(p.dim0 * p.rest for u in self.units for p in u.params if p.trainable)

    @property
    def trainable_tensors(self) -> int:
        return sum(p.trainable for u in self.units for p in u.params)

    def all_gather_bytes(self, n: int) -> int:
        """One gather of every unit, bytes per rank (the gathered output buffers); 0 for n = 1."""
        if n <= 1:
            return 0
        return self._cached("ag", n, lambda: sum(n * u.shard_numel(n) * self.param_bytes for u in self.units))

    def reduce_scatter_bytes(self, n: int) -> int:
        """One backward's reduce-scatters, bytes per rank (fp32 inputs of the trainable units)."""
        if n <= 1:
            return 0
        return self._cached("rs", n, lambda: sum(n * u.shard_numel(n, trainable_only=True) * REDUCE_BYTES
                                                 for u in self.units if u.trainable))

    def cross_gang_bytes(self, n: int, grad_bytes: int = REDUCE_BYTES) -> float:
        """One rank's cross-gang all-reduce per RL step, on average over its gang of n (what
        the time model charges): `gang_cross_gang_bytes(n, grad_bytes) / n`."""
        return self.gang_cross_gang_bytes(n, grad_bytes) / n

    def gang_cross_gang_bytes(self, n: int, grad_bytes: int = REDUCE_BYTES) -> int:
        """A gang's cross-gang all-reduce per RL step, summed over its n ranks: each rank an
        fp32 mask (one element per trainable tensor) and the flat buffer of its local
        gradient sums, `grad_bytes` per element (our trainers: `grad_sum_bytes`, float64 or
        float32, digenrl.math.grad_sum). FSDP2 chunks dim 0 (the last ranks hold less,
        unpadded), so the local shards of a gang add up to the whole trainable numel."""
        return self._cached(("ar", grad_bytes), n, lambda: 4 * n * self.trainable_tensors
                            + grad_bytes * self.trainable_numel)

    def grad_sum_bytes(self, choice: str = "auto") -> int:
        """Bytes per element of our trainers' gradient sums under `train.grad_sum=choice`."""
        return grad_sum_bytes(choice, self.trainable_numel)

    def payload_gather_bytes(self, n: int, trainable_only: bool) -> int:
        """The publish gather of the payload, bytes per rank: each payload tensor's gathered
        output (every tensor, or the trainable ones: adapters), in param dtype; 0 for n = 1."""
        if n <= 1:
            return 0
        return self._cached(f"pg{trainable_only}", n, lambda: sum(
            n * u.shard_numel(n, trainable_only=trainable_only) * self.param_bytes for u in self.units))

    def gather_unit_bytes(self, n: int) -> float:
        """The largest unit's gather, bytes per rank: what a prefetching FSDP cannot hide."""
        if n <= 1:
            return 0.0
        return self._cached("ag1", n, lambda: max(n * u.shard_numel(n) * self.param_bytes for u in self.units))


# ----------------------------------------------------------------------------- layouts


def tiny_dit_layout(model: "ModelConfig") -> ModelLayout:
    """The tiny DiT's FSDP units, from the module built on the meta device with the config's
    LoRA (digenrl.models.build_policy's order: base weights, then adapters, then shard)."""
    import torch

    from digenrl.models.lora import LoraSpec, apply_lora, trainable_state_dict
    from digenrl.models.tiny_dit import LORA_TARGETS, TinyDiT, TinyDiTConfig
    from digenrl.models.tiny_dit_weights import check_tiny_dit_file, find_base, missing_base_message

    path = model.path or find_base()
    if path is None:
        raise FileNotFoundError(missing_base_message())
    with torch.device("meta"):
        module = TinyDiT(TinyDiTConfig(**check_tiny_dit_file(path)))
        if model.lora_rank > 0:
            module.requires_grad_(False)
            apply_lora(module, LoraSpec(model.lora_rank, model.lora_alpha,
                                        tuple(model.lora_targets or LORA_TARGETS)))
    return module_layout(module, DTYPE_BYTES[model.dtype], trainable_state_dict(module), name="tiny-dit")


def module_layout(module, param_bytes: int, payload: Optional[dict] = None, name: str = "") -> ModelLayout:
    """The units shard_policy makes of a torch module: each `blocks[i]`, then the root with the
    parameters no block holds. payload: the tensors a relay sends (default: every parameter)."""
    def params(mod, skip=frozenset()):
        out = []
        for pname, p in mod.named_parameters():
            if id(p) in skip:
                continue
            dim0 = p.shape[0] if p.dim() else 1
            out.append(Param(dim0, p.numel() // max(dim0, 1), p.requires_grad))
        return tuple(out)

    units, in_blocks = [], set()
    for i, block in enumerate(getattr(module, "blocks", None) or []):
        units.append(FsdpUnit(f"blocks.{i}", params(block)))
        in_blocks |= {id(p) for p in block.parameters()}
    units.append(FsdpUnit("root", params(module, in_blocks)))
    tensors = payload if payload is not None else dict(module.named_parameters())
    return ModelLayout(name, tuple(units), param_bytes, sum(t.numel() for t in tensors.values()) * param_bytes)


def catalogue_layout(model: str, lora: bool = False, rank: int = 32, param_bytes: int = 2) -> ModelLayout:
    """A catalogue model (sim.catalogue.MODELS): params_B split evenly over its `layers` blocks
    (each block one flat tensor; LoRA adapters a second, trainable one). The embedders and
    final layer are folded into the blocks: at 24-60 blocks of 0.1-0.5B each, FSDP's padding
    (< gang size elements per tensor) and the root's share change no byte count that matters."""
    m = get_model(model)
    per_block = round(m.params_B * 1e9 / m.layers)
    per_lora = round(lora_params_B(model, rank) * 1e9 / m.layers) if lora else 0
    block = (Param(per_block, 1, not lora),) + ((Param(per_lora, 1, True),) if lora else ())
    units = tuple(FsdpUnit(f"blocks.{i}", block) for i in range(m.layers))
    payload = (per_lora if lora else per_block) * m.layers * param_bytes
    return ModelLayout(model, units, param_bytes, payload)


def layout_for(cfg: "Config", model: Optional[str] = None) -> ModelLayout:
    """The layout a Config's trainers shard: the tiny DiT's own, else the catalogue entry
    `model` (default: the model of cfg.runtime.testbed)."""
    if cfg.model.name == "tiny-dit":
        return tiny_dit_layout(cfg.model)
    if model is None:
        from digenrl.sim.testbed import load_testbed

        if not cfg.runtime.testbed:
            raise ValueError(f"model.name={cfg.model.name}: name the catalogue model (or set runtime.testbed)")
        model = load_testbed(cfg.runtime.testbed).model
    return catalogue_layout(model, cfg.model.lora_rank > 0, cfg.model.lora_rank or 32, DTYPE_BYTES[cfg.model.dtype])


# ----------------------------------------------------------------------------- per-unit traffic


@dataclass(frozen=True)
class GangComm:
    """What one trainer gang issues per unit, bytes summed over its ranks (the counters' sums)."""

    layout: ModelLayout
    gang: int  # ranks per gang
    gangs: int  # trainer gangs (HSDP replicas)
    after_step: bool  # reshard=after-step
    backward_batch: int  # samples per forward/backward chunk (0: one chunk)
    ref_forward: bool  # a no-grad reference forward per chunk (KL or Diffusion-DPO, under LoRA)
    sp: int = 1  # sequence-parallel degree inside the gang: gang / sp data groups share the rows
    adapters_only: bool = False  # the published payload is the trainable tensors (lora-only; nccl under LoRA)
    grad_bytes: int = REDUCE_BYTES  # per element of the cross-gang all-reduce (train.grad_sum)
    old_forward: bool = False  # DiffusionNFT's old-policy forward per chunk (train.nft_decay > 0)
    pairs_per_pass: int = 0  # train.pairs_per_pass: packed (sample, step) pairs per pass (learner.passes)
    defer: bool = True  # our learner's rule (defers_reduction); False: a peer as it ships reduces every backward

    @classmethod
    def from_config(cls, cfg: "Config", layout: ModelLayout) -> "GangComm":
        t = cfg.runtime.trainer
        n = t.gang if t.shard == "fsdp" else 1
        engine, lora = cfg.runtime.weight_sync, cfg.model.lora_rank > 0
        return cls(layout, n, t.workers, t.reshard == "after-step", cfg.train.backward_batch,
                   (cfg.train.beta > 0 or cfg.train.loss == "dpo") and lora, t.sp if n > 1 else 1,
                   engine == "lora-only" or (engine == "nccl" and lora), layout.grad_sum_bytes(cfg.train.grad_sum),
                   cfg.train.nft_decay > 0, cfg.train.pairs_per_pass)

    @property
    def defers_reduction(self) -> bool:
        """The gradient is reduce-scattered once per Train unit, after its last pass, when the
        unsharded trainable gradient is small (learner.Learner.defers_reduction's rule)."""
        return self.defer and self.layout.trainable_numel <= AUTO_FLOAT64_PARAMS

    @property
    def gather(self) -> int:
        """One gather of every unit on every rank of the gang."""
        return self.gang * self.layout.all_gather_bytes(self.gang)

    @property
    def publish(self) -> int:
        """The publish gather on every rank of the gang (weight_sync.payload_state's tensors)."""
        return self.gang * self.layout.payload_gather_bytes(self.gang, self.adapters_only)

    def passes(self, rows: int, trained_steps: int) -> int:
        """Forward/backward passes each rank runs for a Train unit: those of the largest share,
        ceil(rows / (N / sp)) rows, cut as learner.passes cuts them (ranks with fewer rows run
        zero-weight ghost passes to match)."""
        per_rank = -(-rows // (self.gang // self.sp))
        return max(pass_count(max(per_rank, 1), trained_steps, self.backward_batch, self.pairs_per_pass), 1)

    def train(self, rows: int, trained_steps: int, gathered: bool) -> tuple[int, int]:
        """(all-gather, reduce-scatter) bytes of a Train unit; `gathered`: after-step params
        already gathered since the last reshard."""
        if self.gang <= 1:
            return 0, 0
        p = self.passes(rows, trained_steps)
        rs = (1 if self.defers_reduction else p) * self.gang * self.layout.reduce_scatter_bytes(self.gang)
        if self.after_step:
            return (0 if gathered else self.gather), rs
        forwards = 1 + self.ref_forward + self.old_forward
        return p * (forwards + 1) * self.gather, rs  # + 1: backward gathers every unit again

    def generate(self, forwards: int, gathered: bool) -> int:
        """All-gather bytes of a Generate unit on a trainer gang (its rows shared out over the
        ranks; every rank runs every forward, a rank without rows on a ghost row)."""
        if self.gang <= 1 or forwards <= 0:
            return 0
        if self.after_step:
            return 0 if gathered else self.gather
        return forwards * self.gather

    @property
    def all_reduce(self) -> int:
        """One gang's share of the cross-gang reduction (every rank, once per RL step)."""
        return self.layout.gang_cross_gang_bytes(self.gang, self.grad_bytes) if self.gangs > 1 else 0


# ----------------------------------------------------------------------------- prediction


def predict_comm(cfg: "Config", trace: "Trace", layout: Optional[ModelLayout] = None,
                 model: Optional[str] = None, sp_dims=None, sp_tokens: Optional[int] = None) -> list[dict]:
    """Per RL step, the `comm/<phase>/<kind>_bytes` the runtime counts for `cfg` running the
    schedule in `trace` (a simulated or a real run's trace: spans must carry their unit).

    Sequence-parallel gangs (runtime.rollout.gang, runtime.trainer.sp > 1) add sim.sp's
    all-to-alls, gathers and reduce-scatters, summed over every rank: trainer gangs' in their
    optimizer windows like the FSDP bytes, rollout gangs' Generate units in the unit's RL step.
    sp_dims / sp_tokens: the transformer's sp.SpDims and image tokens S (default: the catalogue
    model's, at cfg.model's height, width and frames).

    Steps are each gang's optimizer windows: what a gang runs after its optimizer step s-1
    up to its optimizer step s is step s's, its publish gather too (trainer-0, after the
    step). Relay sends (weight_sync=nccl) belong to the step of the publisher's window the
    WeightSync starts in. Every key of PHASES x KINDS is present (0 when nothing moved).
    """
    from digenrl.config.contract import contract

    layout = layout or layout_for(cfg, model)
    comm = GangComm.from_config(cfg, layout)
    spg = contract(cfg).shape.samples_per_group
    sp = _SpComm.from_config(cfg, model, sp_dims, sp_tokens)
    publishes = cfg.run.mode != "colocated" and cfg.runtime.rollout.workers > 0
    steps: list[dict] = []

    def add(step: int, phase: str, kind: str, nbytes: int) -> None:
        while len(steps) <= step:
            steps.append({key(p, k): 0 for p in PHASES for k in KINDS})
        steps[step][key(phase, kind)] += nbytes

    opt_end: dict[str, list[float]] = {}
    for wid, role in trace.workers.items():
        if role not in ("trainer", "colocated"):
            continue
        spans = sorted((s for s in trace.spans if s.worker == wid and not (s.extra or {}).get("lost")),
                       key=lambda s: s.start)
        step, gathered, ends = 0, False, []
        for s in spans:
            if s.kind == "train":
                u = s.unit
                rows = u.samples[1] - u.samples[0] if u.samples else len(u.groups) * spg
                ag, rs = comm.train(rows, len(u.t_steps), gathered)
                add(step, "train", "all_gather", ag)
                add(step, "train", "reduce_scatter", rs)
                for kind, nbytes in sp.train(rows, len(u.t_steps)).items():
                    add(step, "train", kind, nbytes)
                gathered = True
            elif s.kind == "generate":
                add(step, "generate", "all_gather", comm.generate(s.unit.t_end - s.unit.t_start, gathered))
                for kind, nbytes in sp.generate(_rows(s.unit, spg), s.unit.t_end - s.unit.t_start, "trainer").items():
                    add(step, "generate", kind, nbytes)
                gathered = True
            elif s.kind == "optimizer":
                add(step, "train", "all_reduce", comm.all_reduce)
                if publishes and wid == "trainer-0":  # unshard every unit once, then reshard
                    add(step, "publish", "all_gather", comm.publish)
                gathered = False
                ends.append(s.end)
                step += 1
        opt_end[wid] = ends
    for s in trace.spans:  # rollout gangs: each Generate unit in its RL step
        if s.kind == "generate" and trace.workers.get(s.worker) == "rollout" and not (s.extra or {}).get("lost"):
            for kind, nbytes in sp.generate(_rows(s.unit, spg), s.unit.t_end - s.unit.t_start, "rollout").items():
                add(s.step, "generate", kind, nbytes)
    if cfg.runtime.weight_sync == "nccl" and publishes:
        ends = opt_end.get("trainer-0", [])
        for s in trace.spans:
            if s.kind == "sync" and not (s.extra or {}).get("lost"):
                add(bisect_right(ends, s.start), "sync", "send", layout.payload_bytes)
    return steps


def _rows(unit, samples_per_group: int) -> int:
    """Samples of a Generate / Train unit (its shard's, when the scheduler shards)."""
    return unit.samples[1] - unit.samples[0] if unit.samples else len(unit.groups) * samples_per_group


@dataclass(frozen=True)
class _SpComm:
    """predict_comm's sequence-parallel side: sim.sp's unit bytes for a Config's gangs."""

    dims: object  # sp.SpDims (None: no sequence parallelism anywhere)
    tokens: int
    elem_bytes: int
    cfg: bool  # CFG as one doubled batch (sampling.guided), in sampling and training alike
    trainer_gang: int
    trainer_sp: int
    rollout_gang: int
    backward_batch: int
    recompute: bool
    ref_forward: int  # no-grad forwards per pass besides the trained one: KL reference, NFT old policy
    pairs_per_pass: int = 0  # train.pairs_per_pass (learner.passes)

    @classmethod
    def from_config(cls, cfg: "Config", model: Optional[str], dims, tokens: Optional[int]) -> "_SpComm":
        from digenrl.sim import sp
        from digenrl.sim.catalogue import Shape

        rt = cfg.runtime
        rgang = rt.rollout.gang if cfg.run.mode != "colocated" else 1
        if dims is None and (rgang > 1 or rt.trainer.sp > 1):
            if model is None:
                from digenrl.sim.testbed import load_testbed

                model = load_testbed(rt.testbed).model
            m = cfg.model
            shape = Shape(m.height, m.width, m.frames or 1)
            dims, tokens = sp.SpDims.from_catalogue(model, shape), sp.image_tokens_for(model, shape)
        return cls(dims, tokens or 0, DTYPE_BYTES[cfg.model.dtype], cfg.sampling.guided,
                   rt.trainer.gang, rt.trainer.sp, rgang, cfg.train.backward_batch, cfg.model.grad_ckpt,
                   int(cfg.train.beta > 0 or cfg.train.loss == "dpo") + int(cfg.train.nft_decay > 0),
                   cfg.train.pairs_per_pass)

    def train(self, rows: int, trained_steps: int) -> dict:
        from digenrl.sim.sp import train_unit_bytes

        if self.trainer_sp <= 1:
            return {}
        return train_unit_bytes(self.dims, rows, trained_steps, self.trainer_gang, self.trainer_sp,
                                self.backward_batch, self.tokens, self.elem_bytes, self.cfg, self.recompute,
                                self.ref_forward, self.pairs_per_pass)

    def generate(self, rows: int, steps: int, role: str) -> dict:
        from digenrl.sim.sp import gang_generate_bytes

        gang, degree = ((self.rollout_gang, self.rollout_gang) if role == "rollout"
                        else (self.trainer_gang, self.trainer_sp))
        if degree <= 1 or steps <= 0:
            return {}
        return gang_generate_bytes(self.dims, rows, steps, gang, degree, self.tokens, self.elem_bytes, self.cfg)
