"""Colocated baselines (DESIGN.md sec. 3): which memory configuration each one runs.

    colocated_plan(cm, ...)   every configuration (replicated, FSDP + rollout copy, FSDP
                              sampling, per node, +offload) -> memory fit (CostModel.fits)
                              and extra seconds (CostModel.phase_switch_s,
                              offload_reload_s, fsdp_gather_per_forward_s) -> the cheapest
                              that fits: the baseline's best legitimate configuration
    style_plan(cm, style, ...) what the colocated-ideal row runs: the cheapest, and it keeps
                              the sampler's log-probs (the shipped peers: shipped.py)

A planner, not a cost formula: it asks CostModel for seconds and GiB and chooses. The
seconds of each extra cost stay CostModel time queries (the duration functions and tests
price them directly); this module owns only the choice among configurations, so nothing
here changes a number for a configuration that has been chosen.
"""

from __future__ import annotations

from digenrl.sim.catalogue import Shape, trainable_params_B
from digenrl.sim.costs import CostModel
from digenrl.sim.devices import Cost

# The colocated-ideal style; the peers as they ship are styles too (shipped.SYSTEMS).
IDEAL = "colocated-ideal"
STYLES = (IDEAL,)


def colocated_plan(cm: CostModel, model: str, device, n_gpus: int, *, gpus_per_node: int = 8,
                   intra: str = "nvlink", inter: str = "ib-400g", gen_batch: int = 1,
                   train_batch: int = 1, lora: bool = False, grad_ckpt: bool = True,
                   cfg: bool = False, shape: Shape | None = None, kl: bool = False,
                   reward: str = "pickscore", denoise_steps: int = 1) -> dict:
    """The cheapest colocated configuration that fits, and its extra costs.

    Options, in order (all hold text encoder + VAE + reward model resident, as colocated
    flow_grpo/DanceGRPO do):
      replicated     full training state on every GPU (DDP), sampling with the same module
      fsdp-copy      FSDP-sharded trainer + full bf16 rollout copy (veRL hybrid engine):
                     rebuild the copy each step (CostModel.phase_switch_s)
      fsdp-sample    sample with the sharded module: exposed all-gather every denoising step
      */node         the FSDP options sharded within a node only (HSDP), gathers over NVLink
      *+offload      the above with optimizer state offloaded to host during generation
    Gradient all-reduce is not here: every mode pays it and the scheduler charges it.
    Returns {"config", "fits", "per_step_s", "per_forward_s", "options"}: per_step_s are
    once-per-RL-step costs, per_forward_s is added to every denoising step.
    """
    link = inter if n_gpus > gpus_per_node else intra
    common = ["text_encoder", "vae", "reward"] + (["ref"] if kl and not lora else [])
    kw = dict(lora=lora, grad_ckpt=grad_ckpt, cfg=cfg, shape=shape, reward=reward,
              gen_batch=gen_batch, train_batch=train_batch)
    trainable = trainable_params_B(model, lora)  # at the default LoRA rank (no rank argument here)
    options = {}
    groups = [(n_gpus, link, "")]  # FSDP over all GPUs; HSDP: shard within a node, replicate across
    if n_gpus > gpus_per_node:
        groups.append((gpus_per_node, intra, "/node"))
    configs = [("replicated", 1, intra, "rollout_shared", False)]
    for shards, lk, tag in groups:
        configs += [("fsdp-copy" + tag, shards, lk, "rollout", True),  # the rollout copy is whole
                    ("fsdp-sample" + tag, shards, lk, "rollout_shared", False)]
    for name, shards, lk, sampler, copy in configs:
        per_fwd = (cm.fsdp_gather_per_forward_s(model, device, shards, lk, gen_batch, cfg, shape)
                   if sampler == "rollout_shared" else Cost(0.0))
        switch = cm.phase_switch_s(model, device, shards, lk, rebuild_rollout_copy=copy)
        for off in (False, True):
            rep = cm.fits(model, ["trainer", sampler] + common, device, fsdp_shards=shards,
                          shards={"rollout": 1}, offload_optimizer=off, **kw)
            step = {"phase_switch": switch,
                    "offload_reload": cm.offload_reload_s(trainable, device, shards, needed=off)}
            cost = sum(float(c) for c in step.values()) + denoise_steps * float(per_fwd)
            options[name + ("+offload" if off else "")] = dict(
                fits=rep.fits, report=rep, per_step_s=step, per_forward_s=per_fwd, cost=cost)
    viable = {k: v for k, v in options.items() if v["fits"]}
    if not viable:
        return {"config": None, "fits": False, "per_step_s": {}, "per_forward_s": Cost(0.0), "options": options}
    best = min(viable, key=lambda k: (viable[k]["cost"], list(options).index(k)))
    o = viable[best]
    return {"config": best, "fits": True, "per_step_s": o["per_step_s"], "per_forward_s": o["per_forward_s"],
            "options": options}


def style_plan(cm: CostModel, style: str, model: str, device, n_gpus: int, **kw) -> dict:
    """The colocated configuration the colocated-ideal row runs (kw as for colocated_plan): the
    cheapest memory plan that fits, with the sampler's log-probs kept (no recompute), the bound
    a perfect colocated framework could reach. Returns {"config", "fits", "per_step_s",
    "per_forward_s", "recompute_logp"}.
    """
    if style not in STYLES:
        raise ValueError(f"colocated needs style in {STYLES} or a shipped system, got {style!r}")
    plan = colocated_plan(cm, model, device, n_gpus, **kw)
    return {"config": plan["config"], "fits": plan["fits"], "per_step_s": plan["per_step_s"],
            "per_forward_s": plan["per_forward_s"], "recompute_logp": False}
