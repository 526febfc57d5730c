"""What a trajectory ships to its trainers, and its bytes: one rule for the rollout, the runtime's
counter and the simulator (no torch: the simulator and the benchmarks import it).

A rollout keeps every latent while it samples; what leaves the worker is what its consumers read:

    reads "transitions"  grpo, grpo-guard, flow-dppo: x_t and x_{t+1} of every trained step t
                         (the learner rescores the SDE step t -> t+1; grpo-guard redraws the noise
                         and recovers the behaviour mean from x_{t+1})
    reads "final"        nft, awm, dpo: the clean sample x_T only (the forward-process targets are
                         redrawn from the seed on the trainer)
    reads "all"          every latent x_0 .. x_T (the layout before lean trajectories)

plus the behaviour log-probs (B, T) float32. A segment that stops at denoising step t_done (a
TAG hand-over, runtime.rollout_segment) also ships x at t_done, where the next segment resumes.
The decoded media (for the reward) and the conditioning travel as before and are not counted here.

Bytes of a shipped trajectory row: columns * latent_values * LATENT_BYTES (the kept latents,
float32) + columns * INDEX_BYTES (each column's denoising step, int64; none for "all") +
num_steps * LATENT_BYTES (the log-probs).
"""

from __future__ import annotations

from typing import Iterable, Sequence

READS = ("transitions", "final", "all")
LATENT_BYTES = 4  # float32 latents and log-probs
INDEX_BYTES = 8  # int64 step index of each kept column


def reads_of(loss: str) -> str:
    """What objective `loss` reads of a trajectory's latents (see the module doc)."""
    from digenrl.math.kinds import CLEAN_SAMPLE_LOSSES

    return "final" if loss in CLEAN_SAMPLE_LOSSES else "transitions"


def kept_steps(trained: Iterable[int], num_steps: int, reads: str, t_done: int | None = None) -> tuple[int, ...]:
    """The denoising-step indices (0 .. num_steps) of the latents one row ships, sorted.

    trained: the row's trained denoising steps (its own under per-sample draws); t_done: the
    segment's last step when it stops early (None: finished), whose latent is then kept too and
    the steps past it dropped (they are not sampled yet)."""
    if reads not in READS:
        raise ValueError(f"trajectory reads {reads!r} unknown; allowed: {', '.join(READS)}")
    end = num_steps if t_done is None else t_done
    if reads == "all":
        keep = set(range(num_steps + 1))
    elif reads == "final":
        keep = {num_steps}
    else:
        keep = {s for t in trained for s in (int(t), int(t) + 1)}
        bad = [s for s in keep if not 0 <= s <= num_steps]
        if bad:
            raise ValueError(f"trained steps {sorted(trained)} out of range for {num_steps} denoising steps")
    if t_done is not None:  # a segment's latest latent, where the next segment resumes
        keep = {s for s in keep if s <= end} | {end}
    return tuple(sorted(keep))


def expected_kept(k: int, levels: int, num_steps: int, reads: str, t_done: int | None = None) -> float:
    """The mean count of `kept_steps` over a row whose k trained steps are drawn without
    replacement from denoising steps 0 .. levels - 1 (sampling.window_draw=sample: each sample
    its own steps; rollout.sampler.trained_steps), t_done as in kept_steps.

    "transitions" keeps step s when s or s - 1 was drawn, so by linearity the mean is the sum
    over s of 1 - C(levels - m_s, k) / C(levels, k), m_s = how many of s, s - 1 are drawable;
    with t_done the steps up to t_done - 1 count and t_done itself is kept. Exact (an average
    over every draw), so a sum over many rows equals kept_steps' sum in expectation."""
    if reads != "transitions":
        return float(len(kept_steps((), num_steps, reads, t_done)))  # (they keep no trained step)
    if not 1 <= k <= levels <= num_steps:
        raise ValueError(f"draw {k} trained steps of {levels} levels ({num_steps} denoising steps)")
    from math import comb

    end = num_steps if t_done is None else t_done - 1
    whole = comb(levels, k)
    kept = sum(1 - comb(levels - sum(0 <= x < levels for x in (s, s - 1)), k) / whole for s in range(end + 1))
    return kept + (0 if t_done is None else 1)


def row_bytes(columns: float, latent_values: int, num_steps: int, reads: str) -> float:
    """Bytes of one shipped row: `columns` kept latents of `latent_values` values each, their
    step index (not for "all", whose columns are the steps), and the log-probs. An int for a
    whole count of columns; `expected_kept`'s mean gives the mean bytes."""
    index = 0 if reads == "all" else columns * INDEX_BYTES
    return columns * latent_values * LATENT_BYTES + index + num_steps * LATENT_BYTES


def trajectory_bytes(rows_trained: Sequence[Iterable[int]], latent_values: int, num_steps: int,
                     reads: str) -> int:
    """Bytes of finished trajectory rows as shipped, one row per entry of `rows_trained` (each
    row's trained denoising steps): sum of row_bytes over the rows' kept steps."""
    return sum(row_bytes(len(kept_steps(t, num_steps, reads)), latent_values, num_steps, reads)
               for t in rows_trained)


def row_share(n: int, ranks: int, rank: int) -> slice:
    """Rank `rank`'s rows of a unit of n rows: contiguous, the first n % ranks ranks one more."""
    base, extra = divmod(n, ranks)
    first = rank * base + min(rank, extra)
    return slice(first, first + base + (1 if rank < extra else 0))


def train_rows(n: int, ranks: int, sp: int, rank: int, loss: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """What rank `rank` of a trainer gang of `ranks` (sequence-parallel degree `sp`) receives of
    a Train unit of n rows, and which of those it trains: ((a, z) rows of the unit it receives,
    (first, last) within them that it trains). Its share (gang.row_share over the gang's data
    groups, as GangRank.share); a rank with no rows receives the unit's first row for its ghost
    passes; DPO ranks receive the whole unit (a pair's loser may lie in another rank's share)."""
    share = row_share(n, ranks // sp, rank // sp) if ranks > 1 else slice(0, n)
    if loss == "dpo":
        return (0, n), (share.start, share.stop)
    if share.start == share.stop:
        return (0, min(1, n)), (0, 0)
    return (share.start, share.stop), (0, share.stop - share.start)
