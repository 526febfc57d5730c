"""Single-device loss and gradient on training units; one optimizer step per RL step.

A training unit is (micro-batch, chunk of trained denoising steps). For every trained
step t the learner recomputes the policy's velocity at (x_t, sigma_t), scores the
recorded x_{t+1} under the SDE step, and takes the clipped GRPO loss (or its GRPO-Guard
variant, `LearnerConfig.loss`) against the behaviour log-prob: the one recorded at rollout,
or the trainer's own (`behaviour_logp=recompute`), with the rollout-train gap reported and,
if asked, corrected per row (`is_correction`; digenrl.math.consistency).
DiffusionNFT (`nft`), Advantage Weighted Matching (`awm`) and online Diffusion-DPO (`dpo`, on
pairs of a unit's prompt groups) train on the clean samples noised along the forward process
instead (rollout.sampler.forward_targets): no recorded log-prob is read. Flow-DPPO
(`flow-dppo`) replaces the clip by a divergence mask.
Gradients of all units of an RL step accumulate, each scaled so that the sum is the mean
over every (sample, trained step) pair of the step, whatever the unit layout; then
`optimizer_step` clips, checks and steps.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import torch

from digenrl.learner.ema import EMA
from digenrl.learner.metrics import add_metric, step_means
from digenrl.learner.old_policy import OldPolicy
from digenrl.learner.passes import Segment, plan_passes
from digenrl.math.grad_sum import AUTO_FLOAT64_PARAMS, GradSum, resolve_grad_sum
from digenrl.math import (AWM_WEIGHTINGS, BEHAVIOUR_KINDS, CLEAN_SAMPLE_LOSSES, DPO_PAIRS, IS_KINDS, LOSS_KINDS,
                          awm_loss, dpo_loss, dpo_pairs, flow_dppo_loss, flow_matching_error, gaussian_mean_kl,
                          grpo_guard_loss, grpo_loss, logp_gap_metrics, nft_loss, nft_old_decay, rollout_correction,
                          sde_step)
from digenrl.models.lora import adapters_disabled, has_lora
from digenrl.models.protocol import Policy, guided_velocity
from digenrl.rollout.sampler import SampleSpec, Trajectories, forward_targets, sde_noise, trained_steps

log = logging.getLogger(__name__)


class Pairs(NamedTuple):
    """The (sample, trained slot) pairs of one pass, flattened (learner.passes)."""

    rows: torch.Tensor  # (n,) long: the micro-batch row of each pair (a row repeats once per slot)
    steps: torch.Tensor  # (n,) long: the denoising step each pair trains (its timestep)
    segments: list  # the pass's (slot, first, last) segments, in the order of `rows`
    step_list: list  # `steps` as Python ints (host code reads these, never the tensor)


@dataclass(frozen=True)
class LearnerConfig:
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    clip_range: float = 1e-4
    beta: float = 0.0  # KL weight to the reference (base) policy
    max_grad_norm: float = 1.0
    ema_decay: float = 0.0  # 0 = no EMA
    # Samples per forward/backward; 0 = the whole micro-batch. Caps activation memory on
    # big models. Ratio == 1 is exact only when this equals the rollout batch (or the
    # kernels are batch-invariant, as the tiny DiT's are on CPU).
    backward_batch: int = 0
    # TSP's batched replay (learner.passes): up to this many (sample, trained slot) pairs per
    # forward/backward, across slots, each pair with its own timestep; 0 = the per-timestep
    # reference (one pass per slot and backward_batch chunk)
    pairs_per_pass: int = 0
    # grpo | grpo-guard (RatioNorm + 1/dt reweighting, math.loss.grpo_guard_loss); guard
    # needs a Gaussian log-prob: flow-sde or dance-sde, not cps
    loss: str = "grpo"
    # nft: the advantage clip c of DiffusionNFT's optimality probability r = 1/2 + clip(A, -c, c) / (2c)
    adv_clip: float = 5.0
    # the dtype the step's gradient is summed in over its units: auto | float64 | float32
    # (digenrl.math.grad_sum: float64 makes the sum independent of the order units finish in)
    grad_sum: str = "auto"
    # rollout: the ratio's denominator is the log-prob the rollout recorded; recompute: the
    # trainer's own under the same weights (veRL's choice). Here that is the loss forward's
    # log-prob, detached: one optimizer step per RL step means the weights that score the
    # unit are the behaviour weights, so no extra forward is needed (see _grpo_loss)
    behaviour_logp: str = "rollout"
    # none | truncated (w = min(pi_train / pi_rollout, is_band)) | mask (drop rows whose
    # ratio leaves [1 / is_band, is_band]); math.consistency.rollout_correction
    is_correction: str = "none"
    is_band: float = 2.0
    # nft: DiffusionNFT's old policy (learner.old_policy), refreshed after each optimizer step
    # as old <- d old + (1 - d) new with d = math.loss.nft_old_decay(version, nft_decay,
    # nft_decay_rate, nft_decay_flat); nft_decay 0 = no old copy: the old policy is the step's
    # start policy, v_old = v detached. nft_beta: the authors' guidance strength beta.
    nft_decay: float = 0.0
    nft_decay_rate: float = 0.001
    nft_decay_flat: int = 0
    nft_beta: float = 1.0
    # -- AWM --
    # awm: A' = clip(A, -adv_clip, adv_clip) * awm_adv_max / adv_clip; the flow-matching error is
    # weighted by awm_weighting (uniform | t | t2 | ghuber, ghuber's power awm_ghuber_power);
    # math.loss.awm_loss. The noise draws per sample are the trained slots.
    awm_adv_max: float = 1.0
    awm_weighting: str = "uniform"
    awm_ghuber_power: float = 0.25
    # -- end AWM --
    # dpo: online Diffusion-DPO (math.dpo) on (winner, loser) pairs of each prompt group
    # (dpo_pairs: best-worst | margin, with dpo_margin in advantage units); dpo_beta: the
    # peers' beta in -log sigmoid(-beta / 2 (d_w - d_l)). The reference is the KL's (below).
    dpo_beta: float = 100.0
    dpo_pairs: str = "best-worst"
    dpo_margin: float = 0.0
    # flow-dppo: the divergence past which a unit still moving away is dropped (math.loss.flow_dppo_loss)
    kl_mask_threshold: float = 1e-5

    def __post_init__(self) -> None:
        if self.loss not in LOSS_KINDS:
            raise ValueError(f"loss {self.loss!r} unknown; allowed: {', '.join(LOSS_KINDS)}")
        if self.behaviour_logp not in BEHAVIOUR_KINDS:
            raise ValueError(f"behaviour_logp {self.behaviour_logp!r} unknown; allowed: {', '.join(BEHAVIOUR_KINDS)}")
        if self.is_correction not in IS_KINDS:
            raise ValueError(f"is_correction {self.is_correction!r} unknown; allowed: {', '.join(IS_KINDS)}")
        if self.is_correction != "none" and self.behaviour_logp != "recompute":
            raise ValueError("is_correction corrects a recomputed behaviour log-prob: with behaviour_logp=rollout "
                             "the ratio already is pi / pi_rollout")
        if not self.is_band > 1.0:
            raise ValueError(f"is_band must be > 1, got {self.is_band}")
        if self.adv_clip <= 0:
            raise ValueError(f"adv_clip must be > 0, got {self.adv_clip}")
        if not 0 <= self.nft_decay < 1 or self.nft_beta <= 0:
            raise ValueError(f"nft_decay must be in [0, 1) and nft_beta > 0, got {self.nft_decay}, {self.nft_beta}")
        if self.nft_decay > 0 and self.loss != "nft":
            raise ValueError(f"nft_decay keeps DiffusionNFT's old policy: it needs loss nft, not {self.loss}")
        if self.awm_weighting not in AWM_WEIGHTINGS or self.awm_adv_max <= 0 or self.awm_ghuber_power <= 0:
            raise ValueError(f"awm_weighting must be one of {', '.join(AWM_WEIGHTINGS)} and awm_adv_max, "
                             f"awm_ghuber_power > 0; got {self.awm_weighting}, {self.awm_adv_max}, {self.awm_ghuber_power}")
        if self.dpo_pairs not in DPO_PAIRS:
            raise ValueError(f"dpo_pairs {self.dpo_pairs!r} unknown; allowed: {', '.join(DPO_PAIRS)}")
        if self.dpo_beta <= 0 or self.dpo_margin < 0 or self.kl_mask_threshold <= 0:
            raise ValueError("dpo_beta and kl_mask_threshold must be > 0 and dpo_margin >= 0")
        if self.pairs_per_pass < 0:
            raise ValueError(f"pairs_per_pass must be >= 0, got {self.pairs_per_pass}")
        if self.pairs_per_pass and self.backward_batch:
            raise ValueError("pairs_per_pass and backward_batch both size a pass: set one of them")
        if self.loss == "dpo" and self.backward_batch:
            raise ValueError("dpo trains whole pairs in one pass: backward_batch must be 0")


class Learner:
    def __init__(self, policy: Policy, config: LearnerConfig):
        self.policy = policy
        self.config = config
        self.params = [p for p in policy.module.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the policy has no trainable parameters")
        self._trainable = sum(p.numel() for p in self.params)
        self.grads = GradSum(self.params, resolve_grad_sum(config.grad_sum, self._trainable))
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        self.ema = EMA(policy.module, config.ema_decay) if config.ema_decay > 0 else None
        # DiffusionNFT's old policy: samples every rollout and gives the loss its v_old
        self.old = OldPolicy(policy.module) if config.nft_decay > 0 else None
        # The KL reference (and DPO's) is the base policy: LoRA disables its adapters; a full
        # fine-tune keeps a frozen copy of the starting weights.
        self._reference: Optional[torch.nn.Module] = None
        if (config.beta > 0 or config.loss == "dpo") and not has_lora(policy.module):
            self._reference = copy.deepcopy(policy.module).requires_grad_(False).eval()
        self._sums: dict[str, float] = defaultdict(float)
        self._dev: dict[str, torch.Tensor] = {}  # this step's metric sums still on the device (_flush)
        self._weight = 0.0
        # FSDP2-sharded module: ranks must issue the same forwards/backwards (ghost passes)
        self.sharded = any(type(p).__name__ == "DTensor" for p in self.params)

    # -- the pairs of one pass ---------------------------------------------------------
    def _pairs(self, traj: Trajectories, segments: Sequence[Segment], spec: SampleSpec) -> Pairs:
        """The rows and denoising steps of a pass's (sample, slot) pairs, in segment order."""
        rows = torch.cat([torch.arange(a, b) for _, a, b in segments])
        step_list = [s for t, a, b in segments for s in trained_steps(spec, traj.coords[a:b], t)]
        return Pairs(rows, torch.tensor(step_list, dtype=torch.long), list(segments), step_list)

    def score(self, traj: Trajectories, t: int, spec: SampleSpec, rows: slice = slice(None)):
        """Recompute the policy's SDE step at trained slot t (the denoising step t, or each
        row's own step under `spec.draw_levels`) with grad: StepOut."""
        first, last, _ = rows.indices(len(traj))
        return self._score(traj, self._pairs(traj, [(t, first, last)], spec), spec)

    @staticmethod
    def _recorded_log_probs(
        traj: Trajectories, t: int, spec: SampleSpec, rows: slice
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(steps, behaviour log-probs), both (b,): each row's step in slot t and the log-prob
        the rollout recorded there (NaN where that step was sampled with the ODE)."""
        steps = torch.tensor(trained_steps(spec, traj.coords[rows], t), dtype=torch.long)
        return steps, traj.log_probs[rows][torch.arange(len(steps)), steps]

    def _score(self, traj: Trajectories, pairs: Pairs, spec: SampleSpec):
        """The policy's SDE step of every pair at once: x_t, x_t+1 and sigma per pair, the
        conditioning repeated per pair (one forward for the whole pass)."""
        device = self.params[0].device
        x = traj.latent(pairs.rows, pairs.steps, check=False).to(device)  # (n, *latent)
        sigma = spec.sigmas[pairs.steps].to(device)  # (n,)
        v = self._velocity(traj, x, sigma, spec, pairs.rows)
        return sde_step(
            x,
            v,
            sigma,
            spec.sigmas[pairs.steps + 1].to(device),
            kind=spec.kind,
            noise_level=spec.noise_level,
            prev_sample=traj.latent(pairs.rows, pairs.steps + 1, check=False).to(device),
            check=False,  # the schedule was checked once for the unit (accumulate), on the host
        )

    def _velocity(self, traj: Trajectories, x: torch.Tensor, sigma: torch.Tensor, spec: SampleSpec, rows):
        """The policy's (guided) velocity at (x, sigma) under the conditions of `rows` (a slice
        or a (n,) index, repeated rows repeating their conditions)."""
        negative = self.policy.negative_cond(x.shape[0]) if spec.guided else None
        cond = {k: v[rows] for k, v in traj.cond.items()}
        return guided_velocity(self.policy, x, spec.model_sigma(sigma), cond, negative, spec.cfg_scale,
                               spec.cfg_scale_low)

    @torch.no_grad()
    def _with_reference(self, fn):
        """fn() evaluated with the KL reference's weights (LoRA: adapters off), no grad."""
        if self._reference is None:
            with adapters_disabled(self.policy.module):
                return fn()
        live = self.policy.module
        self.policy.module = self._reference
        try:
            return fn()
        finally:
            self.policy.module = live

    @staticmethod
    def _behaviour_mean(traj: Trajectories, pairs: Pairs, spec: SampleSpec, std: torch.Tensor) -> torch.Tensor:
        """The rollout policy's SDE mean of each pair, (n, *latent): the sampler drew
        x_{t+1} = mean_old + std * noise with noise a pure function of (seed, coords, t), so
        mean_old = x_{t+1} - std * noise, whichever policy version and worker generated it."""
        if spec.kind not in ("flow-sde", "dance-sde"):
            raise ValueError(f"grpo-guard needs a Gaussian SDE log-prob (flow-sde or dance-sde), not {spec.kind}")
        x_next = traj.latent(pairs.rows, pairs.steps + 1, check=False).to(std.device)
        coords = [c for _, a, b in pairs.segments for c in traj.coords[a:b]]
        noise = sde_noise(x_next.shape[1:], spec, coords, pairs.step_list).to(std.device)
        return x_next - std.detach() * noise

    def _forward_targets(self, traj: Trajectories, pairs: Pairs, spec: SampleSpec):
        """(x0, x_t, sigma) of every pair for the clean-sample losses: each segment's rows
        noised along the forward process for its slot (`forward_targets`)."""
        device = self.params[0].device
        x0 = traj.latent(pairs.rows, spec.num_steps, check=False).to(device)  # (n, *latent)
        parts, at = [], 0
        for t, a, b in pairs.segments:
            parts.append(forward_targets(x0[at:at + b - a], spec, traj.coords[a:b], t))
            at += b - a
        return x0, torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    # -- one unit -----------------------------------------------------------------------
    def accumulate(
        self, traj: Trajectories, t_steps: list[int], spec: SampleSpec, *, total_samples: int, total_steps: int,
        rows: Optional[slice] = None, passes: int = 0,
    ) -> dict[str, float]:
        """Backward the loss of one unit: trained slots `t_steps` of micro-batch `traj`.

        The unit's (sample, slot) pairs are cut into passes (`learner.passes.plan_passes`:
        `pairs_per_pass` packed pairs per pass, or the per-timestep layout), one forward and
        one backward each. Each pair weighs 1 / (total_samples * total_steps), so the
        gradients of all units of a step add up to the mean over (sample, step) pairs,
        whatever the layout.

        rows: the rows of `traj` this learner trains (default all): a rank of a sharded gang
        trains its share of the unit. passes: forward/backward passes to run for the whole
        unit (0 = as many as the rows need); the extra ones are zero-weight "ghost" passes on
        the unit's first pair, so that every rank of an FSDP gang issues the same collectives
        whatever its share (a rank with no rows runs ghosts only). On a sharded module the
        gradient is reduced once, after the unit's last pass, when the unsharded trainable
        gradient is small (`defers_reduction`). Nothing in a pass reads a value back to the
        host: metrics and non-finite losses are summed on the device and read at the optimizer
        step (`accumulated`, `optimizer_step`); returns {}.
        """
        if traj.advantages is None:
            raise ValueError("trajectories have no advantages yet: compute rewards and advantages first")
        self.policy.module.train()
        adv = traj.advantages.to(self.params[0].device)
        first, last, _ = (rows or slice(0, len(traj))).indices(len(traj))
        c = self.config
        self._check_latents(traj, t_steps, spec, first, last)
        if c.loss == "dpo":
            return self._accumulate_pairs(traj, t_steps, spec, adv, first, last, total_samples * total_steps)
        if not bool((spec.sigmas[:-1] > spec.sigmas[1:]).all()):  # (host values: no device read)
            raise ValueError("the sampling schedule's sigmas must decrease strictly")
        plan = plan_passes(first, last, t_steps, c.backward_batch, c.pairs_per_pass)
        if passes and passes < len(plan):
            raise ValueError(f"{passes} passes cannot train rows [{first}, {last}) x {len(t_steps)} slots "
                             f"in {len(plan)} passes")
        if c.loss not in CLEAN_SAMPLE_LOSSES and last > first:  # clean samples: no log-prob
            every = self._pairs(traj, [(t, first, last) for t in t_steps], spec)
            logp = traj.log_probs[every.rows, every.steps]
            if bool(torch.isnan(logp).any()):
                raise ValueError(f"denoising step {int(every.steps[torch.isnan(logp)][0])} was sampled with the ODE: "
                                 "it has no log-prob to train")
        ghost = [(t_steps[0], 0, 1)]
        plan = plan + [None] * (max(passes - len(plan), 0))  # None: a ghost pass
        metrics: dict[str, float] = {}
        with self._reduce_once(len(plan)) as before_pass:
            for i, segments in enumerate(plan):
                before_pass(i)
                if segments is None:
                    self._backward_pairs(traj, self._pairs(traj, ghost, spec), spec, adv, 1, ghost=True)
                else:
                    metrics = self._backward_pairs(traj, self._pairs(traj, segments, spec), spec, adv,
                                                   total_samples * total_steps)
        return metrics

    def _check_latents(self, traj: Trajectories, t_steps: list[int], spec: SampleSpec, first: int, last: int) -> None:
        """A lean trajectory (rollout.sampler.ship) carries every latent this unit's passes read,
        checked once on the host before them (the passes read them unchecked): x_T of every row
        for the clean-sample losses (DPO: of the whole unit, pairs span it), else x_t and x_t+1
        of each pair; row 0 at the first slot too, for ghost passes."""
        if traj.latent_steps is None:
            return
        if self.config.loss in CLEAN_SAMPLE_LOSSES:
            rows = torch.arange(len(traj)) if self.config.loss == "dpo" else torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(first, last)])
            traj.check_latents(rows, spec.num_steps)
            return
        every = self._pairs(traj, [(t_steps[0], 0, 1)] + [(t, first, last) for t in t_steps if last > first], spec)
        traj.check_latents(torch.cat([every.rows, every.rows]), torch.cat([every.steps, every.steps + 1]))

    @property
    def defers_reduction(self) -> bool:
        """A sharded module reduces its gradient once per unit (FSDP2 no_sync between the
        unit's passes) when holding the unsharded trainable gradient costs at most what
        `train.grad_sum=auto` allows a float64 sum (LoRA adapters, small models); a large
        full fine-tune reduces after every pass instead."""
        return self.sharded and self._trainable <= AUTO_FLOAT64_PARAMS

    @contextlib.contextmanager
    def _reduce_once(self, n: int):
        """Yields before_pass(i): on a module that defers its reduction, gradient sync is off
        for passes 0 .. n-2 and on for the last; always on again afterwards."""
        module = self.policy.module
        defer = self.defers_reduction and n > 1 and hasattr(module, "set_requires_gradient_sync")

        def before_pass(i: int) -> None:
            if defer:
                module.set_requires_gradient_sync(i == n - 1)

        try:
            yield before_pass
        finally:
            if defer:
                module.set_requires_gradient_sync(True)

    def _backward_pairs(self, traj: Trajectories, pairs: Pairs, spec: SampleSpec, adv: torch.Tensor,
                        denominator: int, ghost: bool = False) -> dict[str, float]:
        """Loss and backward of one pass, weighted into the step mean. A ghost pass (see
        `accumulate`) backwards weight 0 and records nothing."""
        unit_loss = {"nft": self._nft_loss, "awm": self._awm_loss}.get(self.config.loss, self._grpo_loss)
        loss, m, weight = unit_loss(traj, pairs, spec, adv, denominator)
        return self._backward(loss, m, weight, traj.step, pairs.segments[0][0], ghost)

    def _backward(self, loss: torch.Tensor, m: dict, weight: float, step: int, t: int, ghost: bool) -> dict[str, float]:
        """Backward `loss * weight` into the step's gradient and fold its metrics into the step's
        sums, on the device: nothing in a pass reads a value back to the host (a read stalls a
        GPU's stream); the sums are read once, at the optimizer step (`_flush`). A non-finite
        loss is counted (train/skipped_units), not branched on: its gradient makes the step's
        norm non-finite, and `optimizer_step` skips the step. A ghost pass backwards weight 0 on
        a sharded module (every rank of a gang runs the same backwards) and records nothing."""
        if ghost:
            if self.sharded:
                self.grads.before_backward()
                (loss.nan_to_num(0.0, 0.0, 0.0) * 0.0).backward()
                self.grads.fold()
            return {}
        self.grads.before_backward()
        (loss * weight).backward()
        self.grads.fold()
        device = loss.device
        self._add_device("train/skipped_units", (~torch.isfinite(loss.detach())).double(), 1.0)
        for k, v in m.items():
            self._add_device(k, torch.as_tensor(v, device=device).detach().double(), weight)
        self._weight += weight
        return {}

    def _add_device(self, key: str, value: torch.Tensor, weight: float) -> None:
        """Fold one pass's metric into the step's device sums: weighted sum, or max for a _max key."""
        value = value.reshape(())
        have = self._dev.get(key)
        if key.endswith("_max"):
            self._dev[key] = value if have is None else torch.maximum(have, value)
        else:
            self._dev[key] = value * weight if have is None else have + value * weight

    def _flush(self) -> None:
        """The device sums into `_sums`: one read back to the host for all of them."""
        if not self._dev:
            return
        keys = list(self._dev)
        values = torch.stack([self._dev[k].to(self._dev[keys[0]].device) for k in keys]).tolist()
        self._dev.clear()
        for k, v in zip(keys, values):
            if k.endswith("_max"):
                add_metric(self._sums, k, v, 1.0)
            else:
                self._sums[k] += v

    def _grpo_loss(self, traj: Trajectories, pairs: Pairs, spec: SampleSpec, adv: torch.Tensor, denominator: int):
        """(loss, metrics, weight in the step mean) of grpo / grpo-guard / flow-dppo on a pass."""
        out = self._score(traj, pairs, spec)
        weight = out.prev_sample.shape[0] / denominator
        kl = None
        if self.config.beta > 0:
            mean_ref = self._with_reference(lambda: self._score(traj, pairs, spec).mean)
            kl = gaussian_mean_kl(out.mean, mean_ref, out.std)
        logp_rollout = traj.log_probs[pairs.rows, pairs.steps].to(out.log_prob.device)
        a = adv[pairs.rows.to(adv.device)]
        # The trainer's own log-prob of the recorded step under the behaviour weights: this
        # forward's, detached (no optimizer step falls between a step's rollout and its units;
        # at policy lag 1 (TCSS) a row from the previous version also carries that version's
        # change). It is what a separate no-grad forward returns
        # (tests/learner/test_consistency_learner.py), so recompute costs no forward.
        logp_train = out.log_prob.detach()
        gap = logp_gap_metrics(logp_rollout, logp_train, self.config.clip_range)
        recompute = self.config.behaviour_logp == "recompute"
        logp_old = logp_train if recompute else logp_rollout
        is_weights, is_metrics = None, {}
        if self.config.is_correction != "none":
            is_weights, is_metrics = rollout_correction(logp_train, logp_rollout, self.config.is_correction,
                                                        self.config.is_band)
        if self.config.loss in ("grpo-guard", "flow-dppo"):
            mean_old = out.mean.detach() if recompute else self._behaviour_mean(traj, pairs, spec, out.std)
        if self.config.loss == "flow-dppo":
            loss, m = flow_dppo_loss(
                out.log_prob, logp_old, a, mean=out.mean, mean_old=mean_old, std=out.std,
                threshold=self.config.kl_mask_threshold, kl=kl, beta=self.config.beta, is_weights=is_weights,
            )
        elif self.config.loss == "grpo-guard":
            loss, m = grpo_guard_loss(
                out.log_prob, logp_old, a,
                mean=out.mean, mean_old=mean_old,
                std=out.std, dt=(spec.sigmas[pairs.steps] - spec.sigmas[pairs.steps + 1]).to(out.std.device),
                clip_range=self.config.clip_range, kl=kl, beta=self.config.beta, is_weights=is_weights,
            )
        else:
            loss, m = grpo_loss(
                out.log_prob, logp_old, a, clip_range=self.config.clip_range, kl=kl, beta=self.config.beta,
                is_weights=is_weights,
            )
        m.update(gap)
        m.update(is_metrics)
        return loss, m, weight

    def _nft_loss(self, traj: Trajectories, pairs: Pairs, spec: SampleSpec, adv: torch.Tensor, denominator: int):
        """DiffusionNFT on a pass: the clean samples x0 = latents[:, T] noised along the
        forward process (`forward_targets`), each pair at its slot's level.

        With `nft_decay` 0 the old policy is the one at the start of this RL step, which is
        these very weights (one optimizer step per RL step): v_old is v detached, from the
        same forward, and the gradient does not depend on the guidance strength beta
        (math.loss.nft_loss), so nft_beta must stay 1. With a decayed old policy (`self.old`)
        v_old is its own no-grad forward, made before the policy's so that the in-place swap
        never touches a tensor the backward needs; then beta acts."""
        x0, x_t, sigma = self._forward_targets(traj, pairs, spec)
        rows = pairs.rows
        v_old = None
        if self.old is not None:
            with torch.no_grad(), self.old.swapped():
                v_old = self._velocity(traj, x_t, sigma, spec, rows)
        v = self._velocity(traj, x_t, sigma, spec, rows)
        v_ref = None
        if self.config.beta > 0:
            v_ref = self._with_reference(lambda: self._velocity(traj, x_t, sigma, spec, rows))
        loss, m = nft_loss(v, v.detach() if v_old is None else v_old, x_t, x0, sigma, adv[rows.to(adv.device)],
                           beta=self.config.nft_beta, adv_clip=self.config.adv_clip, v_ref=v_ref,
                           kl_beta=self.config.beta)
        return loss, m, x0.shape[0] / denominator

    def _awm_loss(self, traj: Trajectories, pairs: Pairs, spec: SampleSpec, adv: torch.Tensor, denominator: int):
        """Advantage Weighted Matching on a pass: the clean samples x0 = latents[:, T] noised
        afresh (`forward_targets`, as DiffusionNFT), the velocity scored against eps - x0
        (math.loss.awm_loss). One optimizer step per RL step: the old policy is these weights,
        so the old log-prob is this forward's, detached (the authors' on-policy form), and the
        ratio is 1 in value; no second forward."""
        x0, x_t, sigma = self._forward_targets(traj, pairs, spec)
        x0 = x0.float()  # (n, *latent)
        target = (x_t - x0) / sigma.reshape(-1, *([1] * (x0.ndim - 1)))  # eps - x0 (every sigma > 0)
        rows = pairs.rows
        v = self._velocity(traj, x_t, sigma, spec, rows)
        v_ref = None
        if self.config.beta > 0:
            v_ref = self._with_reference(lambda: self._velocity(traj, x_t, sigma, spec, rows))
        c = self.config
        loss, m = awm_loss(v, target, sigma, adv[rows.to(adv.device)], adv_clip=c.adv_clip, adv_max=c.awm_adv_max,
                           clip_range=c.clip_range, weighting=c.awm_weighting, ghuber_power=c.awm_ghuber_power,
                           v_ref=v_ref, kl_beta=c.beta)
        return loss, m, x0.shape[0] / denominator

    # -- online Diffusion-DPO: a unit's pairs --------------------------------------------
    def dpo_slots_per_pass(self, pairs: int, slots: int) -> int:
        """Trained slots per DPO pass: 1 per-timestep; packed, as many slots of the unit's
        `pairs` (2 rows each) as `pairs_per_pass` rows hold (at least one)."""
        if not self.config.pairs_per_pass or pairs <= 0:
            return 1
        return max(1, min(slots, self.config.pairs_per_pass // (2 * pairs)))

    def _accumulate_pairs(self, traj: Trajectories, t_steps: list[int], spec: SampleSpec, adv: torch.Tensor,
                          first: int, last: int, denominator: int) -> dict[str, float]:
        """DPO's `accumulate`: the unit's (winner, loser) pairs (math.dpo.dpo_pairs over all its
        rows: its prompt groups are whole, which config.schema ensures) whose winner lies in
        [first, last) are this learner's, so the ranks of a gang split the pairs and each pair
        is trained once. A pass takes the pairs' 2P rows at `dpo_slots_per_pass` slots, through
        the policy and the reference. Every rank runs the same passes, counted from the unit's
        pairs (which every rank sees): a rank without pairs runs zero-weight ghosts on the
        unit's first pair, so every rank of an FSDP gang issues the same forwards.

        Each pair weighs group_size / denominator per slot in the step mean: with best-worst
        (one pair per group) the step's loss is the mean over pairs and trained steps; with
        margin, a group's pairs add up."""
        pairs = dpo_pairs(adv, traj.group_ids.tolist(), self.config.dpo_pairs, self.config.dpo_margin)
        mine = [p for p in pairs if first <= p[0] < last]
        group_size = int(torch.bincount(traj.group_ids).max())
        ghost_pair = pairs[:1] or [(0, min(1, len(traj) - 1))]  # a unit without pairs still runs its passes
        k = self.dpo_slots_per_pass(len(pairs), len(t_steps))
        metrics: dict[str, float] = {}
        with self._reduce_once(-(-len(t_steps) // k)) as before_pass:
            for i, at in enumerate(range(0, len(t_steps), k)):
                before_pass(i)
                slots = t_steps[at:at + k]
                if mine:
                    loss, m = self._dpo_loss(traj, slots, mine, spec)
                    metrics = self._backward(loss, m, len(slots) * len(mine) * group_size / denominator, traj.step,
                                             slots[0], False)
                elif self.sharded:
                    loss, m = self._dpo_loss(traj, slots[:1], ghost_pair, spec)
                    self._backward(loss, m, 0.0, traj.step, slots[0], True)
        return metrics

    def _dpo_loss(self, traj: Trajectories, slots: list[int], pairs: list[tuple[int, int]], spec: SampleSpec):
        """Diffusion-DPO on `pairs` at trained `slots`: the clean samples x0 = latents[:, T] of
        winners then losers (each slot's in turn), each pair noised with the winner's forward
        noise and level (one eps and one sigma per pair, as Diffusion-DPO and yifan123/flow_grpo@ac4c86e
        scripts/train_sd3_dpo.py:884-899 draw them), scored by the policy and by the reference."""
        device = self.params[0].device
        winners = torch.tensor([w for w, _ in pairs], dtype=torch.long)
        losers = torch.tensor([l for _, l in pairs], dtype=torch.long)
        coords = [traj.coords[w] for w, _ in pairs] * 2  # the winner's noise for both rows
        xw, xl, sw, sl = [], [], [], []
        for t in slots:
            x0 = traj.latent(torch.cat([winners, losers]), spec.num_steps, check=False).to(device)
            x_t, sigma = forward_targets(x0, spec, coords, t)
            n = len(pairs)
            xw.append(x_t[:n]), xl.append(x_t[n:]), sw.append(sigma[:n]), sl.append(sigma[n:])
        rows = torch.cat([winners.repeat(len(slots)), losers.repeat(len(slots))])
        x0 = traj.latent(rows, spec.num_steps, check=False).to(device)
        x_t, sigma = torch.cat(xw + xl), torch.cat(sw + sl)
        v_ref = self._with_reference(lambda: self._velocity(traj, x_t, sigma, spec, rows))
        v = self._velocity(traj, x_t, sigma, spec, rows)
        return dpo_loss(flow_matching_error(v, x_t, x0, sigma), flow_matching_error(v_ref, x_t, x0, sigma),
                        beta=self.config.dpo_beta)

    def sampling_weights(self):
        """A context in which the module holds the weights that sample rollouts: DiffusionNFT's
        old policy when it is kept (`nft_decay` > 0), else the live weights (a no-op)."""
        return self.old.swapped() if self.old is not None else contextlib.nullcontext()

    def accumulated(self) -> tuple[dict[str, float], float]:
        """Weighted metric sums and total weight since the last optimizer step (a trainer
        that combines several learners' metrics needs both, see runtime/driver.py)."""
        self._flush()
        return dict(self._sums), self._weight

    def zero_grad(self) -> None:
        """Drop what `accumulate` gathered (gradients, loss sums) without an optimizer step.

        For a step that is abandoned rather than applied, and for timing `accumulate` on
        its own (`digenrl.profile`): every repeat then starts from no gradient, like the
        first unit of a step.
        """
        self.optimizer.zero_grad(set_to_none=True)
        self.grads.clear()
        self._sums.clear()
        self._dev.clear()
        self._weight = 0.0

    # -- the step ----------------------------------------------------------------------
    def optimizer_step(self, version: Optional[int] = None) -> dict[str, float]:
        """Clip, check and apply the accumulated gradient; returns the step's metrics.

        `version`: the policy version this step makes (RL step + 1), which DiffusionNFT's
        old-policy decay is scheduled by (its global_step); required when `self.old` is kept.
        The old policy is refreshed even when a non-finite gradient skips the step, as the
        authors refresh it after every epoch.
        """
        if self.old is not None and version is None:
            raise ValueError("optimizer_step needs the version it makes to refresh the old policy (nft_decay > 0)")
        self._flush()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)
        skipped = not torch.isfinite(grad_norm)
        if self._sums.get("train/skipped_units"):
            log.warning("%d training passes had a non-finite loss", int(self._sums["train/skipped_units"]))
        if skipped:
            log.warning("non-finite gradient norm: optimizer step skipped")
        else:
            self.optimizer.step()
            if self.ema is not None:
                self.ema.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.grads.clear()
        metrics = step_means(self._sums, self._weight)
        metrics["train/grad_norm"] = float(grad_norm)
        metrics["train/skipped_step"] = float(skipped)
        metrics["train/skipped_units"] = self._sums.get("train/skipped_units", 0.0)
        if self.old is not None:
            c = self.config
            decay = nft_old_decay(version, c.nft_decay, c.nft_decay_rate, c.nft_decay_flat)
            self.old.refresh(decay)
            metrics["train/nft_old_decay"] = decay
        self._sums.clear()
        self._weight = 0.0
        return metrics
