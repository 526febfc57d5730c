"""Colocated memory plans (the colocated-ideal row, docs/design/simulator.md section 3): which layouts exist, which fit, what each costs.

    LAYOUTS                    every memory plan a colocated system can run (below)
    layout_fit(cm, layout, ..) THE memory rule for colocated rows: the same layout on the same
                               parts fits or does not, for colocated-ideal and for the shipped
                               peers alike (shipped.fit maps a peer onto its layout and asks here)
    layout_costs(cm, layout, ..) the seconds a layout forces (per RL step, per forward)
    colocated_plan(cm, ...)    every layout -> fit + forced seconds -> the cheapest that fits
    style_plan(cm, style, ...) what a colocated style runs: colocated-ideal, the layout it is
                               given or the cheapest; the runtime's own run.mode=colocated
                               (RUNTIME), RUNTIME_LAYOUT only. Both keep the sampler's log-probs
                               (the peers: shipped.py)

A layout says how the training state is spread (`shard`: replicated, zero2 = bf16 weights whole
with gradients and AdamW state sharded, fsdp = everything sharded), over how many GPUs (`group`:
every GPU, or a node, HSDP-style), what samples (`sampler`: shared = the trained module itself,
copy = a whole bf16 rollout copy rebuilt by an all-gather after every optimizer step, fsdp = the
sharded module, gathering every forward), what waits on the host while the trainer trains
(`parked`: the rollout copy, text encoder, VAE, reward model; moved back for generation over
PCIe), and whether the AdamW state leaves the GPU outside the train phase (`offload`).

A planner, not a cost formula: it asks CostModel for seconds and GiB and chooses. The seconds of
each forced cost stay CostModel time queries, so a layout costs the same whichever row runs it:
colocated-ideal pays only what its layout forces; a peer as shipped pays that too, plus the
mechanisms its code adds (shipped.py). Hence colocated-ideal, offered every peer's layout, is
never slower than a peer on the same knobs (tests/sim/test_invariants.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from digenrl.sim.catalogue import BYTES_WEIGHT, TEXT_ENCODERS, VAES, Shape, get_model, get_reward, trainable_params_B
from digenrl.sim.collectives import pcie_s
from digenrl.sim.costs import CostModel
from digenrl.sim.devices import Cost
from digenrl.sim.memory import FitReport, Memory, fits_memories

# The colocated styles: colocated-ideal (a bound: any layout, the cheapest that fits) and the
# runtime's own run.mode=colocated, which runs one layout (RUNTIME_LAYOUT: every GPU a gang of 1
# holding the whole training state, sampling with the trained module, nothing parked or offloaded;
# workload.config_for writes it). The peers as they ship are styles too (shipped.SYSTEMS).
IDEAL = "colocated-ideal"
RUNTIME = "colocated"
RUNTIME_LAYOUT = "replicated"
STYLES = (IDEAL, RUNTIME)
PARKABLE = ("rollout", "text_encoder", "vae", "reward")  # roles that may wait on the host while training


@dataclass(frozen=True)
class Layout:
    """One colocated memory plan (module doc)."""

    shard: str  # replicated | zero2 | fsdp
    group: str = "world"  # world | node: the GPUs one shard group spans (zero2, fsdp)
    sampler: str = "shared"  # shared | copy | fsdp
    parked: tuple = ()  # roles on the host during the train phase (PARKABLE)
    offload: bool = False  # AdamW state on the host outside the train phase
    no_sync: bool = False  # fsdp: accumulate unsharded gradients, reduce once per optimizer step

    @property
    def name(self) -> str:
        base = {"replicated": "replicated", "zero2": "zero2"}.get(self.shard) or f"fsdp-{self.sampler}"
        parked = list(self.parked)
        if self.shard == "fsdp" and self.sampler == "copy" and set(self.parked) == set(PARKABLE):
            base, parked = "fsdp-sleep", []  # veRL's hybrid engine: the rollout copy and its encoders sleep
        return (base + ("/node" if self.group == "node" and self.shard != "replicated" else "")
                + (f"+park({','.join(parked)})" if parked else "") + ("+offload" if self.offload else "")
                + ("+no_sync" if self.no_sync else ""))

    @property
    def reward_server(self) -> bool:
        """fsdp-sleep: the reward model is a server woken for its own phase, tensor-parallel over the
        GPUs (veRL's reward loop), so each GPU holds, parks and moves 1/n of it."""
        return self.shard == "fsdp" and self.sampler == "copy" and set(self.parked) == set(PARKABLE)

    def shards(self, n_gpus: int, gpus_per_node: int) -> int:
        """GPUs over which the optimizer state (and, fsdp, the weights) is sharded."""
        if self.shard == "replicated":
            return 1
        return min(n_gpus, gpus_per_node) if self.group == "node" else n_gpus


def layouts(n_gpus: int, gpus_per_node: int) -> list[Layout]:
    """Every layout a colocated system on n_gpus can run (node groups only across nodes)."""
    groups = ["world"] + (["node"] if n_gpus > gpus_per_node else [])
    parks = [(), ("reward",), ("text_encoder", "vae", "reward")]
    out = [Layout("replicated", "world", "shared", p, o) for p, o in product(parks, (False, True))]
    out += [Layout("zero2", g, "shared", p, o) for g, p, o in product(groups, parks, (False, True))]
    for g, o, ns in product(groups, (False, True), (False, True)):
        out += [Layout("fsdp", g, "fsdp", p, o, ns) for p in parks]
        out += [Layout("fsdp", g, "copy", p, o, ns) for p in parks]
        out.append(Layout("fsdp", g, "copy", ("rollout",) + parks[2], o, ns))  # fsdp-sleep
    return out


def layout_fit(cm: CostModel, lay: Layout, model: str, device, n_gpus: int, gpus_per_node: int, *,
               gen_batch: int = 1, train_batch: int = 1, lora: bool = False, lora_rank: int = 32,
               grad_ckpt: bool = True, cfg: bool = False, train_cfg: bool = False, shape: Shape | None = None,
               kl: bool = False, reward: str = "pickscore") -> FitReport:
    """THE memory rule of colocated rows (memory.fits_memories' phases): the train phase holds the
    trainer state, its activations and every role not parked; the other phases hold the trainer's
    weights (its AdamW state too unless offloaded), every role, and the largest forward."""
    s = lay.shards(n_gpus, gpus_per_node)
    kw = dict(lora=lora, lora_rank=lora_rank, grad_ckpt=grad_ckpt, shape=shape, reward=reward)
    trainer = cm.memory_gib(model, "trainer", device, batch=train_batch, fsdp_shards=s if lay.shard == "fsdp" else 1,
                            cfg=train_cfg, **kw)
    if lay.no_sync:  # gradients accumulate unsharded until the optimizer step's reduction
        whole = cm.memory_gib(model, "trainer", device, batch=train_batch, fsdp_shards=1, cfg=train_cfg, **kw)
        trainer = Memory(trainer.weights, whole.grads, trainer.optimizer, trainer.activations, trainer.estimated)
    if lay.shard == "zero2":  # bf16 weights whole, gradients and AdamW state sharded
        part = cm.memory_gib(model, "trainer", device, batch=train_batch, fsdp_shards=s, cfg=train_cfg, **kw)
        trainer = Memory(trainer.weights, part.grads, part.optimizer, trainer.activations, trainer.estimated)
    sampler = "rollout" if lay.sampler == "copy" else "rollout_shared"
    gen_shards = s if lay.sampler == "fsdp" else 1  # an FSDP sampler holds only two gathered layers beyond its shard
    mems = {"trainer": trainer,
            sampler: cm.memory_gib(model, sampler, device, batch=gen_batch, cfg=cfg, fsdp_shards=1, **kw)}
    if lay.sampler == "fsdp":
        mems[sampler] = Memory(0.0, activations=mems[sampler].activations + 2 * BYTES_WEIGHT * get_model(model).params_B
                               * 1e9 / get_model(model).layers / 2**30 * (gen_shards > 1), estimated=True)
    for role in ("text_encoder", "vae", "reward") + (("ref",) if kl and not lora else ()):
        mems[role] = cm.memory_gib(model, role, device, batch=gen_batch, fsdp_shards=s if lay.shard == "fsdp" else 1,
                                   **kw)
    if lay.reward_server:  # tensor-parallel over the GPUs
        r = mems["reward"]
        mems["reward"] = Memory(r.weights / n_gpus, activations=r.activations, estimated=True)
    training = {r: m for r, m in mems.items() if r not in lay.parked and r != "rollout_shared"}
    return fits_memories(device, mems, train_roles=training, offload_optimizer=lay.offload)


def parked_bytes(model: str, lay: Layout, reward: str, n_gpus: int = 1) -> float:
    """bf16 bytes one GPU parks on the host while training (a reward server: its 1/n share)."""
    m = get_model(model)
    sizes = {"rollout": m.params_B, "text_encoder": TEXT_ENCODERS[m.text_encoder][0], "vae": VAES[m.vae][0],
             "reward": get_reward(reward)[0] / (n_gpus if lay.reward_server else 1)}
    return sum(BYTES_WEIGHT * sizes[r] * 1e9 for r in lay.parked)


def layout_costs(cm: CostModel, lay: Layout, model: str, device, n_gpus: int, gpus_per_node: int, link: str, *,
                 gen_batch: int = 1, lora: bool = False, lora_rank: int = 32, cfg: bool = False,
                 shape: Shape | None = None, reward: str = "pickscore") -> tuple[dict, Cost]:
    """(seconds forced once per RL step by name, seconds forced on every sampling forward).

    phase_switch    toggles, empty_cache, a sync; + the all-gather that rebuilds a rollout copy
    park            the parked roles to the host and back over PCIe (pinned)
    offload_reload  the AdamW state (12 B/param of this GPU's shard) to the host and back
    per forward     an FSDP sampler's all-gather, what the forward cannot hide
    """
    s = lay.shards(n_gpus, gpus_per_node)
    step = {"phase_switch": cm.phase_switch_s(model, device, s, link, rebuild_rollout_copy=lay.sampler == "copy"),
            "offload_reload": cm.offload_reload_s(trainable_params_B(model, lora, lora_rank), device, s,
                                                  needed=lay.offload)}
    if lay.parked:
        step["park"] = Cost(2 * pcie_s(parked_bytes(model, lay, reward, n_gpus), device), True,
                            "parked roles over PCIe")
    per_fwd = (cm.fsdp_gather_per_forward_s(model, device, s, link, gen_batch, cfg, shape)
               if lay.sampler == "fsdp" else Cost(0.0))
    return step, per_fwd


def colocated_plan(cm: CostModel, model: str, device, n_gpus: int, *, gpus_per_node: int = 8,
                   intra: str = "nvlink", inter: str = "ib-400g", gen_batch: int = 1,
                   train_batch: int = 1, lora: bool = False, lora_rank: int = 32, grad_ckpt: bool = True,
                   cfg: bool = False, train_cfg: bool = False, shape: Shape | None = None, kl: bool = False,
                   reward: str = "pickscore", denoise_steps: int = 1, only: str | None = None) -> dict:
    """Every layout on n_gpus with its fit and forced seconds, and the cheapest that fits (or
    `only`, a layout name). Gradient reduction and the training gathers are not here: the
    duration function charges them per unit for every layout alike.
    Returns {"config", "fits", "per_step_s", "per_forward_s", "options", "layout", "report"}."""
    options = {}
    fit_kw = dict(gen_batch=gen_batch, train_batch=train_batch, lora=lora, lora_rank=lora_rank,
                  grad_ckpt=grad_ckpt, cfg=cfg, train_cfg=train_cfg, shape=shape, kl=kl, reward=reward)
    for lay in layouts(n_gpus, gpus_per_node):
        if only is not None and lay.name != only:
            continue
        s = lay.shards(n_gpus, gpus_per_node)
        link = intra if s <= gpus_per_node else inter
        rep = layout_fit(cm, lay, model, device, n_gpus, gpus_per_node, **fit_kw)
        step, per_fwd = layout_costs(cm, lay, model, device, n_gpus, gpus_per_node, link, gen_batch=gen_batch,
                                     lora=lora, lora_rank=lora_rank, cfg=cfg, shape=shape, reward=reward)
        cost = sum(float(c) for c in step.values()) + denoise_steps * float(per_fwd)
        options[lay.name] = dict(fits=rep.fits, report=rep, per_step_s=step, per_forward_s=per_fwd, cost=cost,
                                 layout=lay)
    if only is not None and not options:
        raise ValueError(f"unknown colocated memory plan {only!r}; allowed: "
                         f"{[x.name for x in layouts(n_gpus, gpus_per_node)]}")
    viable = {k: v for k, v in options.items() if v["fits"]}
    if not viable:
        best = min(options, key=lambda k: options[k]["report"].peak_gib)  # the nearest miss, for the reason
        o = options[best]
        return {"config": None, "fits": False, "per_step_s": {}, "per_forward_s": Cost(0.0), "options": options,
                "layout": o["layout"], "report": o["report"], "nearest": best}
    best = min(viable, key=lambda k: (viable[k]["cost"], list(options).index(k)))
    o = viable[best]
    return {"config": best, "fits": True, "per_step_s": o["per_step_s"], "per_forward_s": o["per_forward_s"],
            "options": options, "layout": o["layout"], "report": o["report"]}


def style_plan(cm: CostModel, style: str, model: str, device, n_gpus: int, memory: str | None = None, **kw) -> dict:
    """The colocated configuration `style` runs (kw as for colocated_plan), with the sampler's
    log-probs kept (no recompute). colocated-ideal: the layout `memory` names, else the cheapest
    that fits (the bound a perfect colocated framework could reach). RUNTIME: RUNTIME_LAYOUT,
    what `digenrl train` runs under run.mode=colocated (another `memory` is refused)."""
    if style not in STYLES:
        raise ValueError(f"colocated needs style in {STYLES} or a shipped system, got {style!r}")
    if style == RUNTIME:
        if memory not in (None, RUNTIME_LAYOUT):
            raise ValueError(f"run.mode=colocated runs the {RUNTIME_LAYOUT} layout only, not {memory!r}")
        memory = RUNTIME_LAYOUT
    plan = colocated_plan(cm, model, device, n_gpus, only=memory, **kw)
    return {**plan, "recompute_logp": False}
