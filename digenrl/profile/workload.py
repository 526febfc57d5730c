"""The micro-batches the measurements run on: real sampler state from the project's own code.

A Workload fixes what one measured micro-batch is: the schedule (`SampleSpec`), the one
denoising step t that is timed (sampled and trained), and the prompts. Its batches are
built with `digenrl.rollout` (start, denoise_step, generate), so the profiler times the
objects the runtime passes around, not look-alikes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from digenrl.models.protocol import Cond, cond_repeat
from digenrl.rollout import sampler
from digenrl.rollout.sampler import SampleSpec, Trajectories

# The CLI's measured step (the H200 calibration's): sigma 0.8 -> 0.7, flow-SDE, noise level 0.7
SIGMA, SIGMA_NEXT, NOISE_LEVEL = 0.8, 0.7, 0.7


@dataclass(frozen=True)
class Workload:
    """One RL step's sampling setup, reduced to what a measured micro-batch needs."""

    spec: SampleSpec
    t: int  # the denoising step timed: an SDE step (it has a log-prob to train)
    prompts: Optional[list[str]] = None  # one per group, cycled; None = the target's batch-1 cond
    group_size: int = 1

    def coords(self, b: int) -> list[tuple[int, int, int]]:
        """(step, group, sample) of b samples laid out in whole groups, as the trainer does."""
        return [(0, i // self.group_size, i % self.group_size) for i in range(b)]

    def _prompts_and_cond(self, b: int, cond1: Cond) -> tuple[list[str], Optional[Cond]]:
        coords = self.coords(b)
        if self.prompts is None:
            return [""] * b, cond_repeat(cond1, b)  # (B, ...) on the policy's device
        return [self.prompts[g % len(self.prompts)] for _, g, _ in coords], None  # the policy encodes them

    def step_batch(self, policy, cond1: Cond, b: int) -> Trajectories:
        """A micro-batch of b samples whose step t is sampled (x_{t+1} and its behaviour
        log-prob recorded by `denoise_step`) with advantages set: what `Learner.accumulate`
        trains on, and what re-running `denoise_step` at t rewrites identically."""
        prompts, cond = self._prompts_and_cond(b, cond1)
        traj = sampler.start(policy, prompts, self.coords(b), self.spec, step=0, version=0, cond=cond)
        # x_t stand-in: the initial noise (the values do not change the cost of a step)
        traj.latents[:, self.t] = traj.latents[:, 0]
        sampler.denoise_step(policy, traj, self.spec, self.t)
        traj.advantages = torch.ones(b)  # (B,) any finite values cost the same
        return traj

    def generated(self, policy, b: int) -> Trajectories:
        """b whole trajectories from `digenrl.rollout.generate` (decoded images included)."""
        if self.prompts is None:
            raise ValueError("a generated batch needs prompts (Workload.prompts)")
        prompts, _ = self._prompts_and_cond(b, {})
        return sampler.generate(policy, prompts, self.coords(b), self.spec, step=0, version=0)


def packed_batch(policy, cond1: Cond, pairs: int) -> tuple[Trajectories, SampleSpec, list[int]]:
    """TSP's packed pass of `pairs` (sample, step) pairs: pairs // 2 samples with two SDE steps
    sampled (0.8 -> 0.75 -> 0.7), both trained in one pass: (micro-batch, spec, trained slots)."""
    spec = SampleSpec(sigmas=torch.tensor([SIGMA, (SIGMA + SIGMA_NEXT) / 2, SIGMA_NEXT, 0.0]), sde_steps=(0, 1),
                      kind="flow-sde", noise_level=NOISE_LEVEL)
    b = max(pairs // 2, 1)
    work = Workload(spec, t=0)
    traj = work.step_batch(policy, cond1, b)
    sampler.denoise_step(policy, traj, spec, 1)  # x_2 and the behaviour log-prob of step 1
    return traj, spec, [0, 1]


def cli_workload() -> Workload:
    """`digenrl profile`'s fixed step: t=0 of the schedule 0.8 -> 0.7 -> 0, SDE on step 0."""
    spec = SampleSpec(sigmas=torch.tensor([SIGMA, SIGMA_NEXT, 0.0]), sde_steps=(0,), kind="flow-sde",
                      noise_level=NOISE_LEVEL)
    return Workload(spec, t=0)


def first_rows(traj: Trajectories, b: int) -> Trajectories:
    """The first b samples of a micro-batch, as their own (finished, undecoded) micro-batch."""
    return replace(traj, prompts=traj.prompts[:b], coords=traj.coords[:b],
                   cond={k: v[:b] for k, v in traj.cond.items()}, latents=traj.latents[:b],
                   log_probs=traj.log_probs[:b], images=None, rewards=None, reward_parts={}, advantages=None)
