"""Sample shards of a micro-batch: concatenate Generate shards, select a Train shard's rows.

    Generate shard [a, b)  -> Trajectories of rows a..b-1 (MicroBatch.coords[a:b])
    Reward                 -> concat_trajectories(all shards, in row order): the micro-batch
    Train shard [c, d)     -> select_rows(concat of the shards overlapping [c, d), ...)

Every random draw is a function of the sample's coordinates, so shards reproduce the rows of
the unsharded trajectory exactly; concatenating them gives the unsharded micro-batch.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from digenrl.models.protocol import cond_cat, cond_select
from digenrl.rollout import Trajectories

Rows = Optional[tuple[int, int]]


def concat_trajectories(trajs: Sequence[Trajectories]) -> Trajectories:
    """Shards of one micro-batch (same step, version and progress), rows in the given order."""
    if len(trajs) == 1:
        return trajs[0]
    first = trajs[0]
    for t in trajs[1:]:
        if (t.step, t.version, t.t_done) != (first.step, first.version, first.t_done):
            raise ValueError("cannot concatenate shards of different steps, versions or progress: "
                             f"{(first.step, first.version, first.t_done)} vs {(t.step, t.version, t.t_done)}")

    def cat(name: str) -> Optional[torch.Tensor]:
        parts = [getattr(t, name) for t in trajs]
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts):
            raise ValueError(f"cannot concatenate shards: {name} is set on some shards only")
        return torch.cat(parts)

    latents, steps = _latent_columns(trajs)
    parts = {}
    if all(t.reward_parts for t in trajs):
        parts = {k: torch.cat([t.reward_parts[k] for t in trajs]) for k in first.reward_parts}
    return Trajectories(
        step=first.step,
        version=first.version,
        prompts=[p for t in trajs for p in t.prompts],
        coords=[c for t in trajs for c in t.coords],
        cond=cond_cat([t.cond for t in trajs]),
        latents=latents,
        log_probs=cat("log_probs"),
        t_done=first.t_done,
        images=cat("images"),
        audio=cat("audio"),
        audio_rate=first.audio_rate,
        rewards=cat("rewards"),
        reward_parts=parts,
        advantages=cat("advantages"),
        latent_steps=steps,
    )


def _latent_columns(trajs: Sequence[Trajectories]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The shards' latents side by side in rows, and their step index: None when every shard
    holds every step; else lean (rollout.sampler.ship), each shard padded to the widest by
    repeating its first column (a repeated column is never the one `Trajectories.latent` finds)."""
    if all(t.latent_steps is None for t in trajs):
        return torch.cat([t.latents for t in trajs]), None
    idx = []
    for t in trajs:
        if t.latent_steps is None:  # every step: its index is the steps themselves
            idx.append(torch.arange(t.latents.shape[1]).expand(len(t), -1))
        else:
            idx.append(t.latent_steps)
    width = max(i.shape[1] for i in idx)
    lat, out = [], []
    for t, i in zip(trajs, idx):
        pad = width - i.shape[1]
        lat.append(torch.cat([t.latents, t.latents[:, :1].expand(-1, pad, *t.latents.shape[2:])], 1) if pad else t.latents)
        out.append(torch.cat([i, i[:, :1].expand(-1, pad)], 1) if pad else i)
    return torch.cat(lat), torch.cat(out)


def select_rows(traj: Trajectories, first: int, last: int) -> Trajectories:
    """Rows [first, last) of `traj` (views, no copies); the whole object when that is all."""
    if (first, last) == (0, len(traj)):
        return traj
    if not 0 <= first < last <= len(traj):
        raise ValueError(f"rows [{first}, {last}) out of range for {len(traj)} rows")
    sl = slice(first, last)

    def part(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if x is None else x[sl]

    return Trajectories(
        step=traj.step,
        version=traj.version,
        prompts=traj.prompts[sl],
        coords=traj.coords[sl],
        cond=cond_select(traj.cond, sl),
        latents=traj.latents[sl],
        log_probs=traj.log_probs[sl],
        t_done=traj.t_done,
        images=part(traj.images),
        audio=part(traj.audio),
        audio_rate=traj.audio_rate,
        rewards=part(traj.rewards),
        reward_parts={k: v[sl] for k, v in traj.reward_parts.items()},
        advantages=part(traj.advantages),
        latent_steps=part(traj.latent_steps),
    )


def row_range(rows: Rows, n: int) -> tuple[int, int]:
    """A unit's `samples` as a concrete [first, last) range of a micro-batch of n rows."""
    return (0, n) if rows is None else rows


def covering(shards: dict, want: tuple[int, int], n: int) -> tuple[list, int]:
    """The values of `shards` ({Generate rows: ref}) overlapping rows `want`, in row order, and
    the micro-batch row where the first of them starts."""
    a, b = want
    picked = sorted(((row_range(r, n), ref) for r, ref in shards.items()
                     if row_range(r, n)[1] > a and row_range(r, n)[0] < b), key=lambda x: x[0])
    if not picked or picked[0][0][0] > a or picked[-1][0][1] < b:
        raise RuntimeError(f"rows {want} are not covered by the generated shards {sorted(map(str, shards))}")
    return [ref for _, ref in picked], picked[0][0][0]
