"""The measurements: each times one piece of the project's own code and emits calibration lines.

    forward              digenrl.rollout.sampler.denoise_step at step t (what `advance` loops over)
    fwd+bwd[-frozen-base] Learner.accumulate over one trained step (full / LoRA on a frozen base)
    decode-* / encode-*  the policy's VAE decode / text encoders
    reward               rollout.finish (decode) + AsyncRewarder.score of generated samples
    optimizer            Learner.optimizer_step (clip + AdamW [+ EMA]) with gradients present
    weights              trainable state dict -> bytes -> loaded into a second copy of the module
    adamw-*, pcie        the system: one flat AdamW step per billion params, host<->device copies
"""

from __future__ import annotations

import copy
import gc
from typing import Any, Callable, Optional

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from digenrl.learner import Learner, LearnerConfig
from digenrl.models.lora import load_trainable_state_dict, trainable_state_dict
from digenrl.profile.targets import Target
from digenrl.profile.timing import GIB, PeakMemory, is_oom, timer
from digenrl.profile.workload import Workload, first_rows
from digenrl.rollout import sampler

SHOWN = ("model", "what", "batch", "grad_ckpt", "ms", "peak_GB", "ms_per_B_params", "h2d_GBps", "bytes")


class Profiler:
    """Times calls (median of `iters` after `warmup`) and collects calibration records."""

    def __init__(self, device: torch.device, warmup: int, iters: int, log: Callable[[str], None] = print):
        self.device = device
        self.time = timer(device, warmup, iters)
        self.peak = PeakMemory(device)
        self.log = log
        self.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.records: list[dict] = []

    def _emit(self, record: dict) -> None:
        record["device"] = self.device_name
        if self.peak.note and "peak_GB" in record:
            record["note"] = self.peak.note
        self.records.append(record)
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in record.items() if k in SHOWN}
        self.log(f"  {shown}")

    def _measure(self, fn: Callable[[], Any], label: str,
                 before: Optional[Callable[[], Any]] = None) -> Optional[tuple[float, Optional[float]]]:
        """(median ms, peak GiB) of fn, or None after an out-of-memory error."""
        try:
            self.peak.reset()
            ms = self.time(fn, before)
            return ms, self.peak.read()
        except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
            if not is_oom(e):
                raise
            self.log(f"  {label}: out of memory, skipped ({str(e).splitlines()[0][:120]})")
            return None
        finally:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _base(self, t: Target, what: str, batch: Optional[int]) -> dict:
        return dict(model=t.name, params_B=t.params_B, tokens=t.tokens, shape=t.shape, what=what, batch=batch)

    # ---- the generator ------------------------------------------------------------

    def forward(self, t: Target, batches: list[int], work: Workload) -> None:
        """One sampler step (velocity [+ guidance] + SDE step + noise draw) per batch size."""
        t.policy.module.eval()  # as the trainer samples
        for b in batches:
            traj = work.step_batch(t.policy, t.cond, b)
            # advance builds the guidance condition once per segment, not per step
            negative = t.policy.negative_cond(b) if work.spec.guided else None
            got = self._measure(lambda: sampler.denoise_step(t.policy, traj, work.spec, work.t, negative=negative),
                                f"forward batch {b}")
            if got is None:
                break
            self._emit(dict(self._base(t, "forward", b), ms=got[0], **_peak(got[1])))

    def train(self, t: Target, batches: list[int], grad_ckpt: bool, work: Workload, what: str = "fwd+bwd",
              learner: Optional[Learner] = None) -> None:
        """Learner.accumulate over the one trained step work.t, per batch size; each repeat
        starts without gradients (Learner.zero_grad, untimed), as a step's first unit does.
        Without `learner`, one with the default LearnerConfig is built on the target."""
        module = t.policy.module
        if grad_ckpt:
            module.enable_gradient_checkpointing()
        learner = learner or Learner(t.policy, LearnerConfig())
        try:
            for b in batches:
                module.eval()
                traj = work.step_batch(t.policy, t.cond, b)  # no grad: the behaviour log-prob

                def unit() -> None:
                    learner.accumulate(traj, [work.t], work.spec, total_samples=b, total_steps=1)

                got = self._measure(unit, f"{what} grad_ckpt={grad_ckpt} batch {b}", before=learner.zero_grad)
                learner.zero_grad()
                if got is None:
                    break
                self._emit(dict(self._base(t, what, b), grad_ckpt=grad_ckpt, ms=got[0], **_peak(got[1])))
        finally:
            if grad_ckpt:
                module.disable_gradient_checkpointing()

    def packed(self, t: Target, batches: list[int]) -> None:
        """TSP's packed pass (learner.passes) of b (sample, step) pairs: b / 2 samples at two
        timesteps, one forward and one backward (what="fwd+bwd-packed", batch = pairs). The cost
        model prices a pass of b pairs as `fwd+bwd` at batch b; these records check it."""
        from digenrl.profile.workload import packed_batch

        for b in [b for b in batches if b >= 2 and b % 2 == 0]:
            t.policy.module.eval()
            traj, spec, slots = packed_batch(t.policy, t.cond, b)
            packed = Learner(t.policy, LearnerConfig(pairs_per_pass=b))

            def unit() -> None:
                packed.accumulate(traj, slots, spec, total_samples=b // 2, total_steps=2)

            got = self._measure(unit, f"fwd+bwd-packed batch {b}", before=packed.zero_grad)
            packed.zero_grad()
            if got is None:
                break
            self._emit(dict(self._base(t, "fwd+bwd-packed", b), grad_ckpt=False, ms=got[0], **_peak(got[1])))

    def lora(self, t: Target, batches: list[int], rank: int, grad_ckpt_options: list[bool], work: Workload) -> None:
        """LoRA on a frozen base, injected as build_policy does (run last: it changes the module)."""
        from digenrl.models.lora import LoraSpec, apply_lora

        t.policy.module.requires_grad_(False)
        apply_lora(t.policy.module, LoraSpec(rank, 2.0 * rank, t.lora_targets))
        for ckpt in grad_ckpt_options:
            self.train(t, batches, ckpt, work, what="fwd+bwd-frozen-base")

    def decode(self, t: Target, batches: list[int]) -> None:
        if getattr(t.policy, "vae", None) is None:
            self.log(f"  {t.name}: no VAE loaded, decode not measured")
            return
        for b in batches:
            latents = torch.randn(b, *t.policy.latent_shape, generator=torch.Generator().manual_seed(b)).to(self.device)
            got = self._measure(lambda: t.policy.decode(latents), f"decode batch {b}")
            if got is None:
                break
            vae_params = sum(p.numel() for p in t.policy.vae.decoder.parameters()) / 1e9
            self._emit(dict(model=t.vae_name, params_B=vae_params, shape=t.shape.split(",")[0], what=t.vae_what,
                            batch=b, ms=got[0], **_peak(got[1])))

    def text(self, t: Target, batches: list[int]) -> None:
        pipe = getattr(t.policy, "text_pipeline", None)
        if pipe is None:
            self.log(f"  {t.name}: no text encoders loaded, encode not measured")
            return
        if getattr(t.policy, "cache", None) is not None:  # repeats would be answered from the cache
            self.log(f"  {t.name}: prompt cache in use, encode not measured")
            return
        n_tokens = int(t.cond["prompt_embeds"].shape[1]) if "prompt_embeds" in t.cond else 0
        params = sum(p.numel() for m in pipe.components.values() if isinstance(m, torch.nn.Module)
                     for p in m.parameters())
        for b in batches:
            prompts = [f"a photo of a cat, number {i}" for i in range(b)]
            got = self._measure(lambda: t.policy.encode_prompts(prompts), f"encode batch {b}")
            if got is None:
                break
            self._emit(dict(model=f"{t.name}-text", params_B=params / 1e9, tokens=n_tokens,
                            what=f"encode-{n_tokens}-tokens", batch=b, ms=got[0], **_peak(got[1])))

    # ---- the run around it ----------------------------------------------------------

    def reward(self, t: Target, batches: list[int], work: Workload, rewarder) -> None:
        """Decode (rollout.finish) + rewarder.score of b generated samples, per batch size."""
        t.policy.module.eval()
        full = work.generated(t.policy, max(batches))  # real samples: a reward may cost more on content
        for b in batches:
            rows = first_rows(full, b)

            def score() -> None:
                sampler.finish(t.policy, rows)
                rewarder.score(rows.images, rows.prompts, rows.group_ids)

            got = self._measure(score, f"reward batch {b}")
            if got is None:
                break
            self._emit(dict(self._base(t, "reward", b), ms=got[0], **_peak(got[1])))

    def optimizer(self, t: Target, learner: Learner) -> None:
        """One Learner.optimizer_step with a gradient on every trainable parameter (batch-free)."""

        def gradients() -> None:  # untimed: optimizer_step clears them
            for p in learner.params:
                p.grad = torch.full_like(p, 1e-3)  # finite: the step is applied, not skipped

        got = self._measure(learner.optimizer_step, "optimizer", before=gradients)
        if got is not None:
            self._emit(dict(self._base(t, "optimizer", None), ms=got[0], **_peak(got[1])))

    def weights(self, t: Target) -> None:
        """Trainable state dict -> bytes -> loaded into a second copy of the module: a weight
        sync through a serialising store on one machine (batch-free). "bytes": the payload."""
        module = t.policy.module
        replica = copy.deepcopy(module)
        nbytes = sum(v.numel() * v.element_size() for v in trainable_state_dict(module).values())

        def sync() -> None:
            blob = save_bytes({k: v.to("cpu").contiguous() for k, v in trainable_state_dict(module).items()})
            load_trainable_state_dict(replica, load_bytes(blob))

        got = self._measure(sync, "weights")
        del replica
        if got is not None:
            self._emit(dict(self._base(t, "weights", None), bytes=nbytes, ms=got[0], **_peak(got[1])))

    # ---- the system ---------------------------------------------------------------

    def adamw(self, params_B: float) -> None:
        """One AdamW step over params_B billion fp32 parameters (one flat tensor: the fused
        kernel's best case, as in the calibration), reported per billion."""
        n = int(params_B * 1e9)
        p = torch.nn.Parameter(torch.zeros(n, device=self.device))
        p.grad = torch.full_like(p, 1e-3)
        try:
            opt, what = torch.optim.AdamW([p], lr=1e-4, fused=True), "adamw-fused-step-fp32"
        except (RuntimeError, ValueError):
            opt, what = torch.optim.AdamW([p], lr=1e-4, foreach=True), "adamw-foreach-step-fp32"
        got = self._measure(opt.step, "adamw")
        del opt, p
        if got is not None:
            self._emit(dict(what=what, params_B=n / 1e9, ms=got[0], ms_per_B_params=got[0] / (n / 1e9)))

    def pcie(self, gib: float = 1.0) -> None:
        if self.device.type != "cuda":
            self.log("  pcie: CPU device, not measured")
            return
        n = int(gib * GIB)
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device=self.device)
        h2d = self.time(lambda: dev.copy_(host, non_blocking=True))
        d2h = self.time(lambda: host.copy_(dev, non_blocking=True))
        del host, dev
        self._emit(dict(what="pcie", d2h_GBps=n / 1e9 / (d2h * 1e-3), h2d_GBps=n / 1e9 / (h2d * 1e-3)))


def _peak(gib: Optional[float]) -> dict:
    return {} if gib is None else {"peak_GB": gib}
