"""config.train: the loss and the optimizer step (TrainConfig), with the checks of each
loss's own keys (AWM, DiffusionNFT's old policy, DPO and Flow-DPPO)."""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.config.errors import check, one_of
from digenrl.math.kinds import AWM_WEIGHTINGS, BEHAVIOUR_KINDS, DPO_PAIRS, GRAD_SUMS, IS_KINDS, LOSS_KINDS


@dataclass
class TrainConfig:
    """The loss and the optimizer step: RL steps, learning rate, clipping, KL, training units."""

    steps: int = 160  # RL steps (one optimizer step each) the run ends at
    lr: float = 1e-3  # AdamW learning rate; for the default LoRA; full fine-tunes of the tiny DiT drift above 1e-4
    weight_decay: float = 0.0  # AdamW weight decay of the trained parameters
    clip_range: float = 1e-4  # log-probs are averaged over dims, so ratios stay near 1
    beta: float = 0.0  # KL weight to the base model
    max_grad_norm: float = 1.0  # the step's summed gradient is clipped to this global L2 norm
    ema_decay: float = 0.0  # 0 = off
    # Trained denoising steps per training unit, in every mode (batch-level modes: an even
    # data-parallel share). 0 = the mode's default: 1 under TSP (gap+tsp, gap+tsp+tag,
    # digenrl), else all trained steps in one unit. See digenrl.config.contract.tsp_chunk.
    tsp_chunk: int = 0
    backward_batch: int = 0  # samples per forward/backward (activation memory); 0 = whole micro-batch
    # TSP's batched replay (digenrl.learner.passes): a Train unit's (sample, trained step) pairs,
    # flattened across its trained steps, run this many to a forward/backward, each pair at its
    # own timestep; 0 = one pass per trained step (and backward_batch chunk), the per-timestep
    # loop. train.loss=dpo packs whole pairs of a group, as many trained steps as fit.
    pairs_per_pass: int = 0
    # grpo: Flow-GRPO's clipped ratio; grpo-guard: GRPO-Guard's RatioNorm + 1/dt reweighting
    # (arXiv 2510.22319, digenrl.math.loss.grpo_guard_loss)
    loss: str = "grpo"
    # The dtype an RL step's gradient is summed in over its training units and across trainers:
    # float64 makes the sum independent of which trainer ran which unit and in what order
    # (digenrl.math.grad_sum); float32 costs half the memory and all-reduce bytes; auto =
    # float64 up to 2^28 trainable parameters (LoRA, small models), else float32.
    grad_sum: str = "auto"
    # -- rollout-train consistency (docs/guides/objectives.md, "Rollout-train consistency") --
    # The log-prob the ratio divides by: rollout (what the rollout recorded) or recompute (the
    # trainer's own for the same step under the same weights, veRL's choice: the ratio is then 1
    # in value and the rollout-train gap moves to train.is_correction). Every step reports the
    # gap either way (consistency/* in metrics.jsonl). recompute costs no forward here: it is the
    # loss forward's own log-prob, detached (one optimizer step per RL step)
    behaviour_logp: str = "rollout"
    # none; truncated: each row's loss times min(pi_train / pi_rollout, train.is_band) (veRL's
    # TIS); mask: rows whose pi_train / pi_rollout leaves [1 / is_band, is_band] are dropped.
    # Needs train.behaviour_logp=recompute
    is_correction: str = "none"
    is_band: float = 2.0  # the correction's bound C (> 1): truncated caps at C, mask keeps [1/C, C]
    # -- DiffusionNFT's old policy --
    # train.loss=nft: the old policy that samples every rollout and anchors the loss is kept as
    # old <- d old + (1 - d) new after each optimizer step, d = min((k - flat) * rate, nft_decay)
    # at version k >= flat, else 0 (NVlabs/DiffusionNFT return_decay: their decay_type 1 is
    # nft_decay 0.5, rate 0.001, flat 0; type 2 is 0.999, 0.0075, 75). 0 = their type 0: the
    # old policy is the step's start policy, no copy kept (digenrl.learner.old_policy)
    nft_decay: float = 0.0
    nft_decay_rate: float = 0.001  # the old-policy decay's rise per optimizer step (train.nft_decay > 0)
    nft_decay_flat: int = 0  # optimizer steps at decay 0 before it rises (train.nft_decay > 0)
    # DiffusionNFT's guidance strength beta: the implicit policies are v_old +- beta (v - v_old)
    # and the loss is scaled by 1 / beta (digenrl.math.loss.nft_loss); it acts only with an
    # old policy kept (train.nft_decay > 0). Not train.beta, the KL weight.
    nft_beta: float = 1.0
    # -- Advantage Weighted Matching --
    # train.loss=awm: the flow-matching error of the clean sample noised afresh, weighted by its
    # advantage A' = clip(A, -reward.adv_clip, reward.adv_clip) * awm_adv_max / reward.adv_clip
    # (scxue/advantage_weighted_matching@be51372 advantage_weighted_matching/scripts/train_sd3_awm.py:1293-1299:
    # their advantage_max 1
    # over adv_clip_max 5); digenrl.math.loss.awm_loss. Noise draws per sample = trained slots
    # (sampling.window, window_draw=sample: each sample its own noise levels).
    awm_adv_max: float = 1.0
    # the error's weighting: uniform | t (x sigma) | t2 (x sigma^2) | ghuber (the authors' SD3.5
    # configs, power awm_ghuber_power 0.25): scxue/advantage_weighted_matching@be51372
    # advantage_weighted_matching/scripts/train_sd3_awm.py:240-251
    awm_weighting: str = "uniform"
    awm_ghuber_power: float = 0.25  # the power of awm_weighting=ghuber (the authors: 0.25)
    # -- end AWM --
    # -- online Diffusion-DPO and Flow-DPPO (docs/guides/objectives.md) --
    # train.loss=dpo: -log sigmoid(-dpo_beta / 2 ((err_w - err_ref_w) - (err_l - err_ref_l))) on
    # (winner, loser) pairs of each prompt group (digenrl.math.dpo), the reference being the base
    # model. dpo_beta: the peers' beta (flow_grpo config/dpo.py and veRL-Omni's online DPO: 100).
    dpo_beta: float = 100.0
    # best-worst: one pair per group, its highest and lowest advantage (both peers); margin:
    # every pair whose advantages differ by more than train.dpo_margin
    dpo_pairs: str = "best-worst"
    dpo_margin: float = 0.0  # train.dpo_pairs=margin: the advantage gap a pair must exceed
    # train.loss=flow-dppo: a unit whose Gaussian step divergence to the behaviour policy is
    # >= this, and still moving away, is dropped (veRL-Omni / UniRL kl_mask_threshold, 1e-5)
    kl_mask_threshold: float = 1e-5

    def __post_init__(self) -> None:
        self._check_awm()
        self._check_nft_old_policy()
        self._check_dpo()
        check(self.steps >= 1, "train.steps", "must be >= 1")
        one_of(self.behaviour_logp, "train.behaviour_logp", BEHAVIOUR_KINDS)
        one_of(self.is_correction, "train.is_correction", IS_KINDS)
        check(self.loss != "nft" or self.behaviour_logp == "rollout", "train.behaviour_logp",
              "DiffusionNFT trains on clean samples, without a log-prob ratio: leave it at rollout with train.loss=nft")
        check(self.loss != "nft" or self.is_correction == "none", "train.is_correction",
              "DiffusionNFT has no log-prob ratio to correct: leave it at none with train.loss=nft")
        check(self.is_correction == "none" or self.behaviour_logp == "recompute", "train.is_correction",
              "corrects the gap between the trainer's recomputed log-prob and the rollout's; with "
              "train.behaviour_logp=rollout the ratio already divides by the rollout's: set recompute")
        check(self.is_band > 1.0, "train.is_band", f"must be > 1, got {self.is_band}")
        check(self.is_correction != "none" or self.is_band == 2.0, "train.is_band",
              "bounds train.is_correction's weight, which is none: set truncated or mask, or leave it at 2.0")
        one_of(self.loss, "train.loss", LOSS_KINDS)
        one_of(self.grad_sum, "train.grad_sum", GRAD_SUMS)
        check(self.loss != "nft" or self.clip_range == 1e-4, "train.clip_range",
              "DiffusionNFT has no ratio to clip: leave train.clip_range at its default 1e-4 with train.loss=nft")
        check(self.lr > 0, "train.lr", "must be > 0")
        check(self.clip_range > 0, "train.clip_range", "must be > 0")
        check(self.beta >= 0, "train.beta", "must be >= 0")
        check(self.max_grad_norm > 0, "train.max_grad_norm", "must be > 0")
        check(0 <= self.ema_decay < 1, "train.ema_decay", "must be in [0, 1)")
        check(self.tsp_chunk >= 0, "train.tsp_chunk", "must be >= 0")
        check(self.backward_batch >= 0, "train.backward_batch", "must be >= 0 (0 = whole micro-batch)")
        check(self.pairs_per_pass >= 0, "train.pairs_per_pass", "must be >= 0 (0 = one pass per trained step)")
        check(self.pairs_per_pass == 0 or self.backward_batch == 0, "train.pairs_per_pass",
              "and train.backward_batch both size a pass: set one of them (pairs_per_pass counts "
              "(sample, trained step) pairs, backward_batch samples of one step)")

    def _check_awm(self) -> None:
        """The AWM keys act only with train.loss=awm; what AWM cannot act on is refused."""
        awm = self.loss == "awm"
        check(self.awm_adv_max > 0, "train.awm_adv_max", "must be > 0")
        check(self.awm_adv_max == 1.0 or awm, "train.awm_adv_max", "scales AWM's advantages: set train.loss=awm, or 1.0")
        one_of(self.awm_weighting, "train.awm_weighting", AWM_WEIGHTINGS)
        check(self.awm_weighting == "uniform" or awm, "train.awm_weighting",
              "weights AWM's flow-matching error: set train.loss=awm, or uniform")
        check(self.awm_ghuber_power > 0, "train.awm_ghuber_power", "must be > 0")
        check(self.awm_ghuber_power == 0.25 or (awm and self.awm_weighting == "ghuber"), "train.awm_ghuber_power",
              "is the power of train.awm_weighting=ghuber: set it (with train.loss=awm), or leave 0.25")
        if awm:
            check(self.behaviour_logp == "rollout", "train.behaviour_logp",
                  "AWM trains on clean samples, without a rollout log-prob: leave it at rollout with train.loss=awm")
            check(self.is_correction == "none", "train.is_correction",
                  "AWM has no rollout log-prob to correct: leave it at none with train.loss=awm")
            # one optimizer step per RL step: the old policy is the live one, the ratio 1 in value
            # (the authors' on-policy runs, scxue/advantage_weighted_matching@be51372
            # advantage_weighted_matching/scripts/train_sd3_awm.py:1282-1284, set clip_range 1: it never acts)
            check(self.clip_range == 1e-4, "train.clip_range",
                  "AWM's ratio is 1 in value here (its old policy is the step's own weights): "
                  "leave train.clip_range at its default 1e-4 with train.loss=awm")

    def _check_dpo(self) -> None:
        """The keys of train.loss=dpo and flow-dppo: each acts only with its loss, and the keys
        those losses have no use for are refused, named."""
        one_of(self.dpo_pairs, "train.dpo_pairs", DPO_PAIRS)
        check(self.dpo_beta > 0, "train.dpo_beta", "must be > 0")
        check(self.dpo_margin >= 0, "train.dpo_margin", "must be >= 0")
        check(self.kl_mask_threshold > 0, "train.kl_mask_threshold", "must be > 0")
        dpo = self.loss == "dpo"
        for key, default in (("dpo_beta", 100.0), ("dpo_pairs", "best-worst")):
            check(dpo or getattr(self, key) == default, f"train.{key}",
                  f"shapes online Diffusion-DPO; train.loss={self.loss}: set train.loss=dpo, or leave it at its default")
        check(self.dpo_margin == 0 or (dpo and self.dpo_pairs == "margin"), "train.dpo_margin",
              "is the advantage gap of train.dpo_pairs=margin (with train.loss=dpo): set those, or leave it at 0")
        check(self.kl_mask_threshold == 1e-5 or self.loss == "flow-dppo", "train.kl_mask_threshold",
              f"is Flow-DPPO's trust region; train.loss={self.loss}: set train.loss=flow-dppo, or leave it at 1e-5")
        if dpo:
            check(self.beta == 0, "train.beta", "is the KL weight; Diffusion-DPO is anchored to its reference by "
                  "its own loss (train.dpo_beta): leave it at 0 with train.loss=dpo")
            check(self.backward_batch == 0, "train.backward_batch",
                  "cuts a Train unit's rows, and a DPO pair must be trained in one pass: leave it at 0 with train.loss=dpo")
        if self.loss in ("dpo", "flow-dppo"):
            check(self.clip_range == 1e-4, "train.clip_range",
                  f"{self.loss} has no ratio clip: leave train.clip_range at its default 1e-4")
        if dpo:
            check(self.behaviour_logp == "rollout", "train.behaviour_logp",
                  "Diffusion-DPO trains on clean samples, without a log-prob ratio: leave it at rollout")
            check(self.is_correction == "none", "train.is_correction",
                  "Diffusion-DPO has no log-prob ratio to correct: leave it at none")

    def _check_nft_old_policy(self) -> None:
        """The DiffusionNFT old-policy keys: each acts only with train.loss=nft and a kept old
        policy, and is refused, named, otherwise."""
        check(0 <= self.nft_decay < 1, "train.nft_decay", f"must be in [0, 1), got {self.nft_decay}")
        check(self.nft_decay == 0 or self.loss == "nft", "train.nft_decay",
              f"keeps DiffusionNFT's old policy; train.loss={self.loss} has none: set train.loss=nft, or 0")
        check(self.nft_decay_rate > 0, "train.nft_decay_rate", "must be > 0")
        check(self.nft_decay_flat >= 0, "train.nft_decay_flat", "must be >= 0")
        for key, default in (("nft_decay_rate", 0.001), ("nft_decay_flat", 0)):
            check(getattr(self, key) == default or self.nft_decay > 0, f"train.{key}",
                  "shapes the old-policy decay, which train.nft_decay 0 turns off: set train.nft_decay > 0, "
                  "or leave it at its default")
        check(self.nft_beta > 0, "train.nft_beta", "must be > 0")
        check(self.nft_beta == 1.0 or self.nft_decay > 0, "train.nft_beta",
              "with train.nft_decay 0 the old policy is the policy being trained, and DiffusionNFT's gradient "
              "does not depend on beta (tests/math/test_nft.py): set train.nft_decay > 0, or leave it at 1")

