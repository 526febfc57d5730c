"""Testbeds: the cluster (pools of GPUs) and the RL workload, as typed, validated config.

A testbed YAML maps one-to-one onto `Testbed` (keys below); presets live in
`digenrl/sim/testbeds/*.yaml` and load by name:

    tb = load_testbed("h200x16-flux")          # or a path to a .yaml file
    tb.n_gpus, tb.shape, tb.tokens, tb.samples_per_step

Validation happens at construction and every error names the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from digenrl.math.kinds import WINDOW_DRAWS
from digenrl.math.payload import READS
from digenrl.sched.preemption import SpotSpec
from digenrl.sim.catalogue import JUDGES, LINKS, MODELS, REWARD_MODELS, WEIGHT_SYNC_METHODS, Shape, tokens_for
from digenrl.sim.devices import (DEVICES, SPOT_INTERRUPTIONS_PER_HOUR, SPOT_NOTICE_S, SPOT_PRICES,
                                 SPOT_REPLACE_S)

POOL_ROLES = ("rollout", "trainer", "any")  # any: one pool the scheduler (or a colocated mode) splits


class TestbedError(ValueError):
    """A testbed key with a wrong value; the message names the key and what is allowed."""

    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class Pool:
    name: str
    count: int
    device: str
    role: str = "any"
    gpus_per_node: int = 8
    intra_link: str | None = None  # overrides links.intra_node for this pool (e.g. PCIe-only L40S nodes)
    inter_link: str | None = None  # overrides links.inter_node for this pool
    # spot (preemptible) GPUs: their price and reclaim process (sim.spot); rollout pools only
    spot: SpotSpec | None = None

    @property
    def nodes(self) -> int:
        return -(-self.count // self.gpus_per_node)


@dataclass(frozen=True)
class Links:
    intra_node: str = "nvlink"  # between GPUs of one node
    inter_node: str = "ib-400g"  # between nodes of one pool
    inter_pool: str = "ib-400g"  # trainers <-> rollout (weight sync, trajectories)


@dataclass(frozen=True)
class Testbed:
    __test__ = False  # not a pytest class

    name: str
    pools: tuple[Pool, ...]
    model: str
    height: int
    width: int
    frames: int = 1
    denoise_steps: int = 16  # sampling steps per trajectory
    trained_steps: int = 8  # trained denoising steps per trajectory (the SDE window)
    group_size: int = 12  # samples per prompt
    groups_per_step: int = 16  # prompts per RL step
    micro_batch: int = 1  # samples per Train unit
    rollout_batch: int = 4  # samples per Generate unit (one forward)
    cfg: bool = False  # classifier-free guidance: doubles every forward
    train_cfg: bool = False  # the trained velocity uses guidance too (flow_grpo train.cfg)
    lora: bool = False
    lora_rank: int = 32
    grad_ckpt: bool = True
    kl: bool = False  # KL to the reference policy (a reference copy for full fine-tunes)
    # DiffusionNFT's kept old policy (train.nft_decay > 0): one more no-grad forward per trained
    # chunk, its v_old (learner.Learner._nft_loss)
    old_forward: bool = False
    # Diffusion-DPO (train.loss=dpo) trains the 2 rows of each pair, not every sample: the rows a
    # prompt group trains (best-worst: 2; margin: every pair, group_size (group_size - 1), an
    # upper bound); 0 = every sample (the other objectives)
    pair_rows: int = 0
    # What leaves a rollout worker (math.payload.READS): the objective's reads of a trajectory;
    # None: those of the objective the flags imply (final: nft, dpo; else transitions)
    trajectory_reads: str | None = None
    # sampling.window_draw: "sample" draws each sample's trained steps (a row ships the mean
    # count of latents, math.payload.expected_kept); "step": one window per RL step
    window_draw: str = "step"
    reward: str = "pickscore"
    # A generative judge's serving (reward in catalogue.JUDGES), as the recipe sets it: the answer
    # length it asks for (max_tokens; None: no cap), eager mode (no CUDA graphs), GPUs per server
    judge_max_tokens: int | None = None
    judge_eager: bool = False
    judge_tp: int = 1
    weight_sync: str = "nccl"
    text_tokens: int | None = None  # text tokens in the joint sequence (the recipe's prompt length; None: the model's)
    # Sequence-parallel degrees (video models with Ulysses attention, sim.sp): fixed here, or
    # None for the planner to pick. rollout_gang: GPUs per rollout worker; trainer_sp: ranks
    # per data group inside a trainer gang.
    rollout_gang: int | None = None
    trainer_sp: int | None = None
    links: Links = field(default_factory=Links)
    # data.prompts (and data.eval_prompts) of the Config a plan writes: the {"prompt", "image"}
    # rows file a conditioned family (edit, image-to-video) reads; None: the toy prompts, and a
    # conditioned family's plan is refused by workload.config_for with this key named
    prompts: str | None = None
    description: str = ""

    def __post_init__(self):
        _validate(self)

    # ---- derived -------------------------------------------------------------

    @property
    def shape(self) -> Shape:
        return Shape(self.height, self.width, self.frames, self.text_tokens)

    @property
    def tokens(self) -> int:
        return tokens_for(self.model, self.shape)

    @property
    def n_gpus(self) -> int:
        return sum(p.count for p in self.pools)

    @property
    def split_pool(self) -> bool:
        """Every GPU may take either role (pools of role "any"): the run sizes its rollout and
        trainer pools itself, and colocated modes can run here."""
        return all(p.role == "any" for p in self.pools)

    @property
    def reads(self) -> str:
        """What a trajectory ships to its trainers (math.payload.READS; trajectory_reads)."""
        if self.trajectory_reads is not None:
            return self.trajectory_reads
        return "final" if self.old_forward or self.pair_rows else "transitions"

    def trained_rows(self, n: int) -> int:
        """Rows a Train unit of n samples (whole groups) trains: n, or its groups' pair rows (dpo)."""
        return n if not self.pair_rows else -(-n // self.group_size) * self.pair_rows

    @property
    def samples_per_step(self) -> int:
        return self.group_size * self.groups_per_step

    def pool(self, role: str) -> tuple[Pool, ...]:
        return tuple(p for p in self.pools if p.role == role)

    def link(self, pool: Pool, n_gpus: int) -> str:
        """The link a collective over n_gpus of `pool` runs on: intra-node if it fits in a node."""
        if n_gpus <= pool.gpus_per_node:
            return pool.intra_link or self.links.intra_node
        return pool.inter_link or self.links.inter_node

    def gang_link(self, pool: Pool, gang: int, gangs: int) -> str:
        """The link the collectives inside each of `gangs` gangs of `gang` GPUs of `pool` run on,
        under the runtime's node-aligned placement (runtime/cluster.py, GangPlacement): gangs are
        placed before single-device workers, each on one node wherever a node still holds it, so
        a node takes gpus_per_node // gang of them. A gang larger than a node, or more gangs than
        the pool's nodes take that way, straddle nodes: every gang is then charged the
        inter-node link (a step waits for its slowest gang at the gradient all-reduce)."""
        if gang <= pool.gpus_per_node and gangs <= pool.nodes * (pool.gpus_per_node // gang):
            return pool.intra_link or self.links.intra_node
        return pool.inter_link or self.links.inter_node

    # ---- I/O -----------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict, source: str = "<dict>") -> "Testbed":
        if not isinstance(d, dict):
            raise TestbedError(f"{source}: a testbed is a mapping of keys, got {type(d).__name__}")
        d = dict(d)
        _check_keys(d, cls, source, "")
        pools = d.get("pools")
        if not isinstance(pools, list) or not pools:
            raise TestbedError(f"{source}: key 'pools' must be a non-empty list of pools")
        out = []
        for i, p in enumerate(pools):
            if not isinstance(p, dict):
                raise TestbedError(f"{source}: key 'pools[{i}]' must be a mapping")
            _check_keys(p, Pool, source, f"pools[{i}].")
            p = dict(p)
            if p.get("spot") is not None:
                p["spot"] = spot_spec(p["spot"], p.get("device"), f"{source}: key 'pools[{i}].spot")
            out.append(Pool(**{"name": f"pool{i}", **p}))
        d["pools"] = tuple(out)
        if "links" in d:
            if not isinstance(d["links"], dict):
                raise TestbedError(f"{source}: key 'links' must be a mapping")
            _check_keys(d["links"], Links, source, "links.")
            d["links"] = Links(**d["links"])
        d.setdefault("name", Path(source).stem)
        try:
            return cls(**d)
        except TestbedError as e:
            raise TestbedError(f"{source}: {e}") from None


SPOT_KEYS = ("price", "interruptions_per_hour", "notice_s", "replace_s")


def spot_spec(d, device: str | None, where: str = "key 'spot") -> SpotSpec:
    """A pool's `spot:` mapping as a SpotSpec: keys it leaves out take the device type's estimates
    (devices.SPOT_*; `price` has no default where no spot price was found for the device).
    `where` begins the error message (it names the key: "key 'pools[1].spot")."""
    if d is True:
        d = {}
    if not isinstance(d, dict):
        raise TestbedError(f"{where}' must be a mapping with keys from {list(SPOT_KEYS)}, got {d!r}")
    unknown = [k for k in d if k not in SPOT_KEYS]
    if unknown:
        raise TestbedError(f"{where}.{unknown[0]}': unknown key; allowed: {list(SPOT_KEYS)}")
    if "price" not in d and device not in SPOT_PRICES:
        raise TestbedError(f"{where}.price': no spot price estimate for device {device!r} (estimates for "
                           f"{sorted(SPOT_PRICES)}); set the price")
    spec = {"price": SPOT_PRICES.get(device), "interruptions_per_hour": SPOT_INTERRUPTIONS_PER_HOUR,
            "notice_s": SPOT_NOTICE_S, "replace_s": SPOT_REPLACE_S, **d}
    for k, v in spec.items():
        if v is None and k == "replace_s":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TestbedError(f"{where}.{k}': must be a number, got {v!r}")
    try:
        return SpotSpec(**{k: (float(v) if v is not None else None) for k, v in spec.items()})
    except ValueError as e:  # SpotSpec's check names spot.<key>
        raise TestbedError(f"{where}': {e}") from None


def list_presets() -> list[str]:
    root = resources.files("digenrl.sim") / "testbeds"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_testbed(name_or_path: str | Path, **overrides) -> Testbed:
    """A preset by name (see list_presets) or a YAML path; keyword overrides replace keys."""
    p = Path(name_or_path)
    if not p.suffix:
        if str(name_or_path) not in list_presets():
            raise TestbedError(f"unknown testbed preset {str(name_or_path)!r}; allowed: {list_presets()}")
        p = Path(str(resources.files("digenrl.sim") / "testbeds" / f"{name_or_path}.yaml"))
    with open(p) as f:
        d = yaml.safe_load(f)
    if overrides:
        d = {**d, **overrides}
    return Testbed.from_dict(d, source=str(p.name))


# ----------------------------------------------------------------------------- validation


def _check_keys(d: dict, cls, source: str, prefix: str) -> None:
    allowed = [f.name for f in dataclasses.fields(cls)]
    for k in d:
        if k not in allowed:
            raise TestbedError(f"{source}: unknown key '{prefix}{k}'; allowed: {allowed}")


def _one_of(key: str, value, allowed) -> None:
    if value not in allowed:
        raise TestbedError(f"key '{key}': {value!r} not allowed; allowed: {sorted(allowed)}")


def _int(key: str, value, lo: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise TestbedError(f"key '{key}': must be an integer >= {lo}, got {value!r}")


def _validate(tb: Testbed) -> None:
    for i, p in enumerate(tb.pools):
        _one_of(f"pools[{i}].device", p.device, DEVICES)
        _one_of(f"pools[{i}].role", p.role, POOL_ROLES)
        _int(f"pools[{i}].count", p.count)
        _int(f"pools[{i}].gpus_per_node", p.gpus_per_node)
        for k in ("intra_link", "inter_link"):
            if getattr(p, k) is not None:
                _one_of(f"pools[{i}].{k}", getattr(p, k), LINKS)
        if p.spot is not None and p.role != "rollout":
            raise TestbedError(f"key 'pools[{i}].spot': only a pool of role 'rollout' may be spot (trainers hold "
                               f"optimizer state a reclaim would lose), got role {p.role!r}")
        if p.count > p.gpus_per_node and p.count % p.gpus_per_node:
            raise TestbedError(f"key 'pools[{i}].count': {p.count} GPUs do not fill whole nodes of "
                               f"{p.gpus_per_node} (gpus_per_node)")
    roles = {p.role for p in tb.pools}
    if "any" in roles and len(roles) > 1:
        raise TestbedError("key 'pools': either every pool has role 'any' (one pool to split) or the pools "
                           "are 'rollout' and 'trainer', not both")
    if "any" not in roles and roles != {"rollout", "trainer"}:
        raise TestbedError(f"key 'pools': need at least one 'rollout' and one 'trainer' pool, got roles {sorted(roles)}")
    _one_of("model", tb.model, MODELS)
    if tb.prompts is not None and not tb.prompts.endswith(".jsonl"):
        raise TestbedError(f"key 'prompts': a .jsonl file of {{\"prompt\": ..., \"image\": ...}} rows, got {tb.prompts!r}")
    _one_of("reward", tb.reward, REWARD_MODELS)
    if tb.trajectory_reads is not None:
        _one_of("trajectory_reads", tb.trajectory_reads, READS)
    _one_of("window_draw", tb.window_draw, WINDOW_DRAWS)
    _one_of("weight_sync", tb.weight_sync, WEIGHT_SYNC_METHODS)
    if tb.judge_max_tokens is not None:
        _int("judge_max_tokens", tb.judge_max_tokens)
    if not isinstance(tb.judge_eager, bool):
        raise TestbedError(f"key 'judge_eager': must be true or false, got {tb.judge_eager!r}")
    _int("judge_tp", tb.judge_tp)
    if tb.reward not in JUDGES:
        for k, default in (("judge_max_tokens", None), ("judge_eager", False), ("judge_tp", 1)):
            if getattr(tb, k) != default:
                raise TestbedError(f"key '{k}': reward {tb.reward!r} scores in one forward, not a generative "
                                   f"judge; the key applies to rewards {sorted(JUDGES)}")
    for k in ("intra_node", "inter_node", "inter_pool"):
        _one_of(f"links.{k}", getattr(tb.links, k), LINKS)
    for k in ("height", "width", "frames", "denoise_steps", "group_size", "groups_per_step",
              "micro_batch", "rollout_batch", "lora_rank"):
        _int(k, getattr(tb, k))
    _int("trained_steps", tb.trained_steps)
    _int("pair_rows", tb.pair_rows, lo=0)
    if tb.trained_steps > tb.denoise_steps:
        raise TestbedError(f"key 'trained_steps': {tb.trained_steps} > denoise_steps ({tb.denoise_steps}); "
                           f"allowed: 1..{tb.denoise_steps}")
    for k in ("cfg", "train_cfg", "lora", "grad_ckpt", "kl", "old_forward"):
        if not isinstance(getattr(tb, k), bool):
            raise TestbedError(f"key '{k}': must be true or false, got {getattr(tb, k)!r}")
    if tb.pair_rows and not tb.kl:  # Diffusion-DPO always runs its reference (workload.testbed_for)
        raise TestbedError("key 'pair_rows': Diffusion-DPO scores every pair against the reference model; "
                           "needs kl: true")
    if tb.train_cfg and not tb.cfg:
        raise TestbedError("key 'train_cfg': true needs cfg: true")
    if tb.weight_sync == "lora-only" and not tb.lora:
        raise TestbedError("key 'weight_sync': 'lora-only' needs lora: true; allowed without LoRA: "
                           "['nccl', 'object-store']")
    for k in ("rollout_gang", "trainer_sp"):
        if getattr(tb, k) is not None:
            _int(k, getattr(tb, k))
    m = MODELS[tb.model]
    if tb.text_tokens is not None:
        _int("text_tokens", tb.text_tokens)
        if not m.text_tokens:
            raise TestbedError(f"key 'text_tokens': {tb.model} reads its prompt by cross-attention (no text tokens "
                               "in the sequence); remove the key")
    if m.kind == "image" and tb.frames != 1:
        raise TestbedError(f"key 'frames': {tb.model} generates images; allowed: 1")
    try:
        tokens_for(m, Shape(tb.height, tb.width, tb.frames))
    except ValueError as e:
        raise TestbedError(f"keys 'height'/'width'/'frames': {e}") from None


def resize(tb: Testbed, gpus: int | None) -> Testbed:
    """The testbed with its single split pool resized to `gpus` (fixed-role testbeds: unchanged)."""
    if gpus is None or gpus == tb.n_gpus:
        return tb
    if len(tb.pools) != 1 or tb.pools[0].role != "any":
        raise ValueError(f"--gpus {gpus}: testbed {tb.name!r} has fixed pools ({tb.n_gpus} GPUs); "
                         "edit its YAML to change pool sizes")
    return dataclasses.replace(tb, pools=(dataclasses.replace(tb.pools[0], count=gpus),),
                               name=f"{tb.name.split('@')[0]}@{gpus}")
