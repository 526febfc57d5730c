"""Cost model: seconds for every unit the scheduler runs, from H200 measurements.

    calibration.fit_table: LinearFit per (model, op), fixed + per_sample * batch, H200
          |                                   |
          |                  token scaling (other resolutions / frame counts)
          |                  device scaling (devices.scale_seconds)
          v                                   v
    CostModel.generate_s / train_chunk_s / reward_s / optimizer_step_s / weight_sync_s
    CostModel.phase_switch_s / offload_reload_s / fsdp_gather_per_forward_s / recompute_logp_s
                                            (the real costs colocated baselines pay)
    CostModel.memory_gib / fits             (memory.py on the same fits: what a worker holds)

CostModel is the one object the simulator passes around: it holds the fitted table and
answers time queries, composed of the pieces with one job each:

    catalogue.py     architectures, links, bytes per parameter (facts, no measurement)
    calibration.py   reading and fitting the calibration file
    collectives.py   bytes on links -> seconds (all-reduce, all-gather, broadcast, object store)
    memory.py        GiB per role and the fit check
    baselines.py     which configuration a colocated baseline runs (asks this model)

What stays here is what needs the fits and a device at once: the compute units (the batch
fit moved to a shape and a GPU) and the transfers priced from model sizes. memory_gib,
fits and lora_params_B are methods too because callers hold a CostModel, not a table.

Conventions. Seconds everywhere (memory: GiB, see memory.py). Every returned number is a
`devices.Cost`: a float with `.estimated` (True when it was extrapolated in batch beyond
the measured points, in tokens, to another device, or comes from no measurement at all)
and `.source`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from digenrl.sim import memory
from digenrl.sim.catalogue import (BYTES_OPT, BYTES_WEIGHT, DEFAULT_LORA_RANK, EAGER_LAYER_S, GIB, MODELS, MS,
                                   REWARD_MFU, TEXT_ENCODERS, VAE_CALIB_SHAPES, VAES, WEIGHT_SYNC_METHODS, Shape,
                                   get_judge, get_link, get_model, get_reward, longest_answer, lora_params_B,
                                   sample_flops)
from digenrl.sim.calibration import adamw_ms_per_B, fit_table, load_calibration
from digenrl.sim.collectives import (allgather_s, allgather_traffic, object_store_fanout_s, relay_chain_s,
                                     object_store_send_s, pcie_s)
from digenrl.sim.devices import REFERENCE, Cost, get_device, scale_seconds, scaled, total


# LoRA with a frozen base skips the weight-gradient GEMMs (one of the backward's two):
# fwd+bwd = 2 forwards (3 with checkpointing) instead of 3 (4). Used when no
# fwd+bwd-frozen-base measurement exists.
LORA_TRAIN_FACTOR = {False: 2.0 / 3.0, True: 3.0 / 4.0}
PHASE_SWITCH_FIXED_S = 0.1  # estimate: mode toggles, torch.cuda.empty_cache, a device sync


@dataclass(frozen=True)
class JudgeServing:
    """How a recipe serves its generative judge (the testbed's judge_* keys): the answer length it
    asks for (max_tokens; None: no cap), eager mode, the tensor-parallel degree of one server, the
    link its all-reduces cross, and whether the caller prices the decode here (decode)."""

    max_tokens: int | None = None
    eager: bool = False
    tp: int = 1
    link: str = "nvlink"
    decode: bool = True

    @classmethod
    def of(cls, tb, decode: bool = True) -> "JudgeServing":
        return cls(tb.judge_max_tokens, tb.judge_eager, tb.judge_tp, tb.links.intra_node, decode)


@dataclass
class CostModel:
    """Per-model, per-device costs from a calibration jsonl (default: the packaged H200 file)."""

    calibration: str | Path | None = None
    table: dict = field(init=False, default_factory=dict)  # (model, op) -> LinearFit, H200 seconds / GiB
    records: list = field(init=False, default_factory=list)

    def __post_init__(self):
        self.records = load_calibration(self.calibration)
        self.table = fit_table(self.records)

    # ---- compute units -------------------------------------------------------

    def _token_factor(self, model: str, shape: Shape | None) -> tuple[float, bool]:
        m = get_model(model)
        if shape is None or shape == m.calib_shape:
            return 1.0, False
        return sample_flops(m, shape) / sample_flops(m), True

    def _timed(self, model: str, op: str, device, batch: float, shape: Shape | None,
               weight_passes: float, degree: int = 1) -> Cost:
        """A fitted op at `batch` on `device`: per-sample part compute-bound (scaled by tokens
        and TFLOP/s), fixed part = weight reads (memory-bound) + host overhead (unchanged).

        degree > 1: one rank of a sequence-parallel gang (sim.sp). Its per-sample part is its
        share of the FLOPs (sp.rank_flops_fraction: tokens / P for the linear layers, heads / P
        for attention, padding and replicated text included; no MFU loss at the smaller
        GEMMs), its fixed part whole (every rank reads every weight, launches every kernel).
        The all-to-alls are the caller's (DurationFn prices their bytes on the gang's link)."""
        fit = self.table[model, op]
        k_tok, tok_est = self._token_factor(model, shape)
        if degree > 1:
            from digenrl.sim.sp import rank_flops_fraction

            k_tok, tok_est = k_tok * rank_flops_fraction(model, shape or get_model(model).calib_shape, degree), True
        measured_max = max((b for b, _ in fit.points), default=0)
        w_read_s = weight_passes * BYTES_WEIGHT * get_model(model).params_B * 1e9 / (get_device(REFERENCE).hbm_gbps * 1e9)
        t_mem = min(fit.fixed, w_read_s)
        est = fit.estimated or tok_est or batch > measured_max  # extrapolated in batch
        t_comp = Cost(fit.per_sample * k_tok * batch, est)
        return scale_seconds(t_comp, t_mem, fit.fixed - t_mem, device, source=f"{model}:{op} {fit.note}".strip())

    def denoise_s(self, model: str, device, batch: int, cfg: bool = False, shape: Shape | None = None,
                  degree: int = 1) -> Cost:
        """One denoising step (one transformer forward) for `batch` samples; CFG doubles the batch.
        degree: a rank of a sequence-parallel gang's share (see _timed)."""
        return self._timed(model, "forward", device, batch * (2 if cfg else 1), shape, weight_passes=1,
                           degree=degree)

    def generate_s(self, model: str, device, batch: int, n_steps: int, cfg: bool = False,
                   shape: Shape | None = None) -> Cost:
        """A Generate unit: n_steps denoising steps of a batch (sampling math is negligible)."""
        return scaled(self.denoise_s(model, device, batch, cfg, shape), n_steps)

    def train_s(self, model: str, device, batch: int, grad_ckpt: bool, lora: bool = False,
                cfg: bool = False, shape: Shape | None = None, degree: int = 1) -> Cost:
        """One training step (forward + backward of one denoising step) for `batch` samples.

        cfg: the trained velocity uses guidance (flow_grpo with train.cfg), doubling the batch.
        LoRA: the fwd+bwd-frozen-base measurement if present, else LORA_TRAIN_FACTOR x full.
        degree: a rank of a sequence-parallel gang's share (see _timed).
        """
        op = "train_ckpt" if grad_ckpt else "train"
        b = batch * (2 if cfg else 1)
        passes = 5 if grad_ckpt else 4  # weights read fwd (+ recompute) + bwd dgrad + wgrad, grads written
        if lora and (model, "lora_" + op) in self.table:
            return self._timed(model, "lora_" + op, device, b, shape, weight_passes=passes - 1, degree=degree)
        t = self._timed(model, op, device, b, shape, weight_passes=passes, degree=degree)
        if lora:
            return scaled(t, LORA_TRAIN_FACTOR[grad_ckpt], estimated=True, source=t.source + " x LoRA factor")
        return t

    def train_chunk_s(self, model: str, device, batch: int, n_trained_steps: int, grad_ckpt: bool,
                      lora: bool = False, cfg: bool = False, shape: Shape | None = None) -> Cost:
        """A Train unit: n_trained_steps independent training steps on a micro-batch."""
        return scaled(self.train_s(model, device, batch, grad_ckpt, lora, cfg, shape), n_trained_steps)

    def vae_decode_s(self, model: str, device, batch: int, shape: Shape | None = None) -> Cost:
        """Decode final latents to pixels; per-pixel(-frame) cost from the matching calibration VAE."""
        m = get_model(model)
        _, calib, factor = VAES[m.vae]
        fit = self.table[calib, "decode"]
        s = shape or m.calib_shape
        k = factor * s.pixels / VAE_CALIB_SHAPES[calib].pixels
        est = k != 1.0 or m.vae != calib
        return scale_seconds(Cost(fit.per_sample * k * batch, est), 0.0, fit.fixed * factor, device,
                             source=f"{m.vae} from {calib} x {k:.2f}")

    def text_encode_s(self, model: str, device, batch: int) -> Cost:
        """Prompt encoding; T5-XXL at 512 tokens measured, others scaled by params * tokens."""
        enc = get_model(model).text_encoder
        fit = self.table["t5xxl", "encode"]
        p, tok = TEXT_ENCODERS[enc]
        k = (p * tok) / (4.762 * 512)
        return scale_seconds(Cost(fit.per_sample * k * batch, enc != "t5xxl"), 0.0, fit.fixed, device,
                             source=f"{enc}: T5-XXL x {k:.2f}")

    def reward_model_s(self, reward: str, device, batch: int, shape: Shape | None = None,
                       judge: "JudgeServing | None" = None) -> Cost:
        """Reward-model work for `batch` samples (no VAE): FLOPs / (H200 peak * REWARD_MFU) + fixed,
        estimated. A generative judge (catalogue.JUDGES): its prefill so, plus the batch's decode
        (judge_decode_s) unless judge.decode is False (a shipped reward phase prices its decode once
        per step, shipped.step_costs)."""
        j = get_judge(reward)
        if j is None:
            _, flops, fixed = get_reward(reward)
            t_comp = batch * flops / (get_device(REFERENCE).bf16_tflops * 1e12 * REWARD_MFU)
            return scale_seconds(Cost(t_comp, True), 0.0, Cost(fixed, True), device, source=f"{reward}: FLOP estimate")
        judge = judge or JudgeServing()
        t = self.judge_prefill_s(reward, device, batch, shape or Shape(512, 512))
        if judge.decode:
            t = total(t, self.judge_decode_s(reward, device, batch, judge))
        return Cost(float(t), True, f"{reward}: prefill + decode")

    def judge_prefill_s(self, reward: str, device, batch: int, shape: Shape) -> Cost:
        """A judge's prefill of `batch` requests: Judge.prefill_flops over the device's bf16 peak at
        REWARD_MFU, + the reward's fixed seconds; estimated."""
        _, _, fixed = get_reward(reward)
        t_comp = batch * get_judge(reward).prefill_flops(shape) / (get_device(REFERENCE).bf16_tflops * 1e12 * REWARD_MFU)
        return scale_seconds(Cost(t_comp, True), 0.0, Cost(fixed, True), device, source=f"{reward}: prefill FLOPs")

    def judge_token_s(self, reward: str, device, tp: int = 1, eager: bool = False, link: str = "nvlink") -> Cost:
        """One decode step of a judge server of `tp` GPUs: its LM weight bytes / tp over the device's
        memory bandwidth (every weight read once per token), + 2 all-reduces per layer at the link's
        latency when tp > 1, + EAGER_LAYER_S per layer in eager mode; estimated."""
        j = get_judge(reward)
        t = j.decode_bytes / tp / (get_device(device).hbm_gbps * 1e9)
        if tp > 1:
            t += 2 * j.layers * get_link(link).latency_s
        if eager:
            t += j.layers * EAGER_LAYER_S
        return Cost(t, True, f"{reward}: decode step, tp {tp}{', eager' if eager else ''}")

    def judge_decode_s(self, reward: str, device, n: int, judge: "JudgeServing") -> Cost:
        """A batch of n answers decoded together: the longest answer's tokens (catalogue.longest_answer,
        capped at max_tokens) x judge_token_s."""
        tokens = longest_answer(get_judge(reward), n, judge.max_tokens)
        return Cost(tokens * float(self.judge_token_s(reward, device, judge.tp, judge.eager, judge.link)), True,
                    f"{reward}: {tokens:.0f} tokens decoded")

    def reward_s(self, model: str, device, batch: int, reward: str = "pickscore",
                 shape: Shape | None = None, judge: "JudgeServing | None" = None) -> Cost:
        """A Reward unit: VAE decode + reward-model work for `batch` samples."""
        return total(self.vae_decode_s(model, device, batch, shape),
                     self.reward_model_s(reward, device, batch, shape, judge), source=f"decode + {reward}")

    def optimizer_step_s(self, params_B: float, device) -> Cost:
        """Fused AdamW step (fp32 master + moments) over params_B billion parameters.

        Measured 8.11 ms per billion on the H200; memory-bound, so scaled by HBM bandwidth.
        """
        per_B = adamw_ms_per_B(self.records)
        return scale_seconds(0.0, per_B * MS * params_B, 0.0, device, source="adamw-fused-step-fp32")

    # ---- weights and sync ----------------------------------------------------

    def lora_params_B(self, model: str, rank: int = DEFAULT_LORA_RANK) -> float:
        """catalogue.lora_params_B: LoRA adapter parameters (billions), for callers holding a CostModel."""
        return lora_params_B(model, rank)

    def weight_bytes(self, model: str, lora: bool = False, rank: int = DEFAULT_LORA_RANK) -> int:
        """Bytes a weight sync moves: the bf16 weights the rollout runs (adapters only for LoRA)."""
        p = lora_params_B(model, rank) if lora else get_model(model).params_B
        return int(BYTES_WEIGHT * p * 1e9)

    def weight_sync_s(self, nbytes: float, link: str, n_receivers: int, method: str = "object-store",
                      sender_device="H200", receiver_device="H200", gpus_per_node: int = 8) -> Cost:
        """Push new weights from the trainers to n_receivers rollout GPUs.

        nccl: the relay's chain (runtime/relay.py): trainer 0's NIC sends the bytes once, each
          receiver forwards them chunk by chunk (collectives.relay_chain_s: the last receiver
          has them after bytes / bw + (n - 1) chunks + n latencies), then the receiver's own
          host -> device load over its PCIe. The sender's device -> host staging is
          OptimizerStep's (durations._publish_s).
        object-store (mm_grpo / Ray default): device->host over PCIe, copy into the object
          store (host memcpy ~10 GB/s), fan-out to receiving nodes over `link` at half its
          NCCL rate (TCP) along a binary tree (ceil(log2(nodes + 1)) hops), host->device.
        lora-only: the object-store path with adapter bytes (pass weight_bytes(model, lora=True)).
        """
        if method not in WEIGHT_SYNC_METHODS:
            raise ValueError(f"method must be one of {WEIGHT_SYNC_METHODS}, got {method!r}")
        if n_receivers <= 0:
            return Cost(0.0)
        if method == "nccl":
            return Cost(float(relay_chain_s(nbytes, link, n_receivers)) + pcie_s(nbytes, receiver_device), True,
                        f"relay chain on {get_link(link).name} + host->device")
        t = object_store_send_s(nbytes, sender_device) + object_store_fanout_s(nbytes, link, n_receivers, gpus_per_node)
        return Cost(t + pcie_s(nbytes, receiver_device), True, f"{method} via {get_link(link).name}")  # + host->device

    # ---- memory (memory.py, on this model's activation fits) ----------------------

    def memory_gib(self, model: str, role: str, device=REFERENCE, **kw) -> memory.Memory:
        """memory.memory_gib with this model's table; kw: batch, lora, grad_ckpt, fsdp_shards,
        cfg, shape, lora_rank, reward. `device` does not change GiB (kept for symmetry with the
        time queries)."""
        return memory.memory_gib(self.table, model, role, **kw)

    def memory_gb(self, *args, **kwargs) -> float:
        """Total of memory_gib in decimal GB (1e9 B), for comparison with datasheet numbers."""
        return self.memory_gib(*args, **kwargs).total * GIB / 1e9

    def fits(self, model: str, roles, device=REFERENCE, **kw) -> memory.FitReport:
        """memory.fits with this model's table: can one GPU of `device` hold `roles` at once?"""
        return memory.fits(self.table, model, roles, device, **kw)

    # ---- colocated baselines' extra costs (docs/design/simulator.md section 4) ---
    # Each returns 0 when it does not apply; none is tuned down. baselines.colocated_plan
    # picks the cheapest configuration that fits, which is the baseline's best legitimate one.

    def phase_switch_s(self, model: str, device, n_gpus: int, link: str, rebuild_rollout_copy: bool) -> Cost:
        """Once per RL step, switching a colocated worker from training to generation.

        shared module (flow_grpo, GenRL, DanceGRPO: the trained module samples):
          PHASE_SWITCH_FIXED_S only (eval/train toggles, empty_cache, a sync; not measured).
        rebuild_rollout_copy (veRL-style hybrid engine: an FSDP-sharded trainer and a full
          rollout copy in one process): the new weights are all-gathered into the copy,
          (n-1)/n * 2P bytes over `link`, after every optimizer step.
        """
        t = Cost(PHASE_SWITCH_FIXED_S, True, "phase switch: fixed estimate")
        if rebuild_rollout_copy:
            t = total(t, allgather_s(self.weight_bytes(model), n_gpus, link))
        return t

    def offload_reload_s(self, params_B: float, device, fsdp_shards: int, needed: bool) -> Cost:
        """Per RL step: optimizer state to host before generation, back before training.

        Bytes = 12 B/param (fp32 master + Adam m, v) / shards, each way over PCIe at the
        device's rate (55 GB/s measured on the H200). Gradients are not moved: they are
        freed after the optimizer step (zero_grad(set_to_none=True)). Zero when not needed.
        """
        if not needed:
            return Cost(0.0)
        nbytes = BYTES_OPT * params_B * 1e9 / max(1, fsdp_shards)
        return Cost(2 * pcie_s(nbytes, device), True, "optimizer state offload + reload over PCIe")

    def fsdp_gather_per_forward_s(self, model: str, device, n_shards: int, link: str, batch: int,
                                  cfg: bool = False, shape: Shape | None = None, overlapped: bool = True) -> Cost:
        """Exposed all-gather per denoising step when the rollout samples with an FSDP-sharded
        module (DanceGRPO, GenRL): each forward gathers 2P bytes, layer by layer,
        (n-1)/n * 2P / bw + L (n-1) latency. FSDP prefetches the next layer during compute,
        so with overlapped=True (its default) only max(0, gather - forward) is exposed.
        """
        if n_shards <= 1:
            return Cost(0.0)
        gather = allgather_traffic(self.weight_bytes(model), n_shards, chunks=get_model(model).layers).seconds(link)
        if not overlapped:
            return Cost(gather, True, "FSDP rollout all-gather, not overlapped")
        fwd = self.denoise_s(model, device, batch, cfg, shape)
        return Cost(max(0.0, gather - float(fwd)), True, "FSDP rollout all-gather, exposed part")

    def recompute_logp_s(self, model: str, device, batch: int, n_trained_steps: int, cfg: bool = False,
                         shape: Shape | None = None) -> Cost:
        """Old log-probs recomputed by the trainer: one extra no-grad forward per trained step.

        flow_grpo does NOT do this (it keeps the sampler's log-probs). mm_grpo (verl-based,
        leibniz-csi/mm_grpo, gerl/trainer/ppo/ray_diffusion_trainer.py fit()) does, via
        actor_rollout_wg.compute_log_prob, unless algorithm.rollout_correction.bypass_mode is
        set; we assume veRL-Omni-style baselines follow verl's default and recompute.
        """
        return scaled(self.denoise_s(model, device, batch, cfg, shape), n_trained_steps)

    def sync_reward_s(self, model: str, device, batch: int, reward: str = "pickscore",
                      shape: Shape | None = None) -> Cost:
        """Synchronous rewards: decode + reward forward on the critical path between generation
        and training (colocated systems); identical to reward_s, named for the breakdown."""
        return self.reward_s(model, device, batch, reward, shape)

    # ---- reporting -----------------------------------------------------------

    def summary(self) -> list[dict]:
        """One row per (model, op) time fit, H200, calibration shape: fixed and per-sample ms."""
        rows = []
        for (model, op), fit in sorted(self.table.items()):
            if model in MODELS and not op.startswith("act_"):
                rows.append(dict(model=model, op=op, fixed_ms=fit.fixed / MS, per_sample_ms=fit.per_sample / MS,
                                 points=len(fit.points), estimated=fit.estimated, note=fit.note))
        return rows


@functools.lru_cache(maxsize=1)
def default_cost_model() -> CostModel:
    """The packaged H200 calibration, fitted once per process."""
    return CostModel()
