"""Lean trajectories (rollout.sampler.ship, math.payload): a shipped trajectory carries only the
latents its objective reads, and the learner's gradient on it is the gradient on the full one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import sigma_schedule
from digenrl.math.payload import kept_steps, row_bytes, trajectory_bytes
from digenrl.rollout import SampleSpec, advance, assemble, expand, payload_bytes, row_kept, ship, ship_rows, start
from digenrl.rollout.sampler import trained_steps
from tests.helpers.host_reads import count_host_reads_in_passes
from tests.learner.tiny_setup import tiny_policy

T = 5
WINDOW = SampleSpec(sigmas=sigma_schedule(T, 1.0), sde_steps=(0, 1, 2, 3), kind="flow-sde", seed=3,
                    trained_slots=(1, 3), reads="transitions")
# per-sample draws (DanceGRPO's window_draw=sample): slot j of row c is its own SDE step
DRAWN = dataclasses.replace(WINDOW, kind="dance-sde", draw_levels=4, trained_slots=(0, 1))
# the clean-sample losses: x_T only, levels drawn over every noise level
CLEAN = dataclasses.replace(WINDOW, sde_steps=(), kind="ode", draw_levels=T, trained_slots=(0, 1), reads="final")
COORDS = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
PROMPTS = ["a red circle", "a red circle", "a blue square", "a blue square"]
ADV = torch.tensor([1.0, -1.0, 0.5, -2.0])


def _batch(policy, spec):
    traj = advance(policy, start(policy, PROMPTS, COORDS, spec, step=0, version=0), spec)
    traj.advantages = ADV.clone()
    return traj


def _grads(learner):
    return torch.cat([p.grad.flatten() for p in learner.params])


def test_payload_rule():
    assert kept_steps([1, 3], 5, "transitions") == (1, 2, 3, 4)
    assert kept_steps([2, 3], 5, "transitions") == (2, 3, 4)  # x_3 is both a successor and a trained x_t
    assert kept_steps([4], 5, "transitions") == (4, 5)
    assert kept_steps([0, 2], 5, "final") == (5,)
    assert kept_steps([], 5, "all") == tuple(range(6))
    assert kept_steps([1, 3], 5, "transitions", t_done=3) == (1, 2, 3)  # a segment stopped at step 3
    assert kept_steps([0], 5, "final", t_done=2) == (2,)
    with pytest.raises(ValueError, match="reads"):
        kept_steps([1], 5, "some")
    with pytest.raises(ValueError, match="out of range"):
        kept_steps([5], 5, "transitions")


@pytest.mark.parametrize("spec", [WINDOW, DRAWN, CLEAN], ids=["window", "drawn", "clean"])
def test_shipped_latents_are_the_trained_steps_and_their_successors(spec):
    policy = tiny_policy()
    full = _batch(policy, spec)
    lean = ship(full, spec)
    assert lean.latents.shape[1] < full.latents.shape[1]
    for i, c in enumerate(COORDS):
        trained = [s for slot in spec.trained_slots for s in trained_steps(spec, [c], slot)]
        want = {T} if spec.reads == "final" else {s + d for s in trained for d in (0, 1)}
        assert set(lean.latent_steps[i].tolist()) == want
        for j, s in enumerate(lean.latent_steps[i].tolist()):
            assert torch.equal(lean.latents[i, j], full.latents[i, s])  # the values, not a recomputation
    torch.testing.assert_close(lean.log_probs, full.log_probs, equal_nan=True)
    # one object for the rows: each as wide as the widest (padded); the runtime ships one per row
    width = max(len(kept_steps([s for slot in spec.trained_slots for s in trained_steps(spec, [c], slot)], T,
                               spec.reads)) for c in COORDS)
    assert payload_bytes(lean) == len(COORDS) * row_bytes(width, lean.latents[0, 0].numel(), T, spec.reads)
    assert payload_bytes(ship(full, dataclasses.replace(spec, reads="all"))) == payload_bytes(full)


def test_row_bytes_are_counted_exactly():
    policy = tiny_policy()
    full = _batch(policy, DRAWN)
    for i, c in enumerate(COORDS):  # one row per object, as the runtime ships them: no padding
        row = ship(dataclasses.replace(full, coords=[c], latents=full.latents[i:i + 1],
                                       log_probs=full.log_probs[i:i + 1]), DRAWN)
        trained = [s for slot in DRAWN.trained_slots for s in trained_steps(DRAWN, [c], slot)]
        assert payload_bytes(row) == trajectory_bytes([trained], row.latents[0, 0].numel(), T, DRAWN.reads)
    assert payload_bytes(full) == trajectory_bytes([[]] * 4, full.latents[0, 0].numel(), T, "all")


def test_a_missing_latent_is_refused():
    policy = tiny_policy()
    lean = ship(_batch(policy, WINDOW), WINDOW)
    with pytest.raises(ValueError, match="did not ship x at denoising step 0"):
        lean.latent(torch.tensor([0]), 0)
    # a unit whose slots the rows did not ship is refused before any pass (slot 0: x_0, x_1)
    learner = Learner(policy, LearnerConfig())
    with pytest.raises(ValueError, match="did not ship x at denoising step 0"):
        learner.accumulate(lean, [0], WINDOW, total_samples=4, total_steps=1)
    assert all(p.grad is None for p in learner.params)


@pytest.mark.parametrize("loss,spec", [
    ("grpo", WINDOW), ("grpo-guard", WINDOW), ("flow-dppo", WINDOW), ("grpo", DRAWN),
    ("nft", CLEAN), ("awm", CLEAN), ("dpo", CLEAN),
])
def test_gradient_on_lean_equals_gradient_on_full(loss, spec):
    policy = tiny_policy()
    full = _batch(policy, spec)
    lean = ship(full, spec)
    slots = list(spec.trained_slots)
    grads = []
    for traj in (full, lean):
        learner = Learner(policy, LearnerConfig(loss=loss, beta=0.01 if loss == "grpo" else 0.0))
        learner.optimizer.zero_grad(set_to_none=True)
        learner.accumulate(traj, slots, spec, total_samples=4, total_steps=len(slots))
        grads.append(_grads(learner))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_a_shipped_segment_resumes_to_the_same_trajectory():
    """A TAG hand-over / rollout segment: ship at step 2, expand on the next worker, finish."""
    policy = tiny_policy()
    whole = _batch(policy, WINDOW)
    part = advance(policy, start(policy, PROMPTS, COORDS, WINDOW, step=0, version=0), WINDOW, 2)
    sent = ship(part, WINDOW)
    assert sent.latent_steps[0].tolist() == [1, 2]  # trained x_1 and where the segment stopped
    done = ship(advance(policy, expand(sent, WINDOW), WINDOW), WINDOW)
    assert torch.equal(done.latents, ship(whole, WINDOW).latents)
    torch.testing.assert_close(done.log_probs, whole.log_probs, equal_nan=True)


@pytest.mark.parametrize("loss,spec", [("grpo", WINDOW), ("grpo", DRAWN), ("nft", CLEAN), ("dpo", CLEAN)])
def test_units_assembled_from_shipped_rows_train_as_the_full_trajectory(loss, spec):
    """The runtime's path: the rows shipped as heads and single latents (ship_rows), each Train
    unit (TSP: one slot) on each of 2 ranks assembled from its rows' latents of its slot only
    (DPO: every row); the step's gradient is the full trajectories' gradient."""
    from digenrl.math.payload import train_rows

    policy = tiny_policy()
    full = _batch(policy, spec)
    heads, flat = ship_rows(full, spec)
    it = iter(flat)
    latent = {(i, s): next(it) for i, c in enumerate(COORDS) for s in row_kept(spec, c)}
    slots = list(spec.trained_slots)
    whole = Learner(policy, LearnerConfig(loss=loss))
    whole.optimizer.zero_grad(set_to_none=True)
    whole.accumulate(full, slots, spec, total_samples=4, total_steps=len(slots))
    split = Learner(policy, LearnerConfig(loss=loss))
    split.optimizer.zero_grad(set_to_none=True)
    for t in slots:
        for rank in range(2):
            (a, z), mine = train_rows(4, 2, 1, rank, loss)
            steps = [list(row_kept(spec, COORDS[i], [t])) for i in range(a, z)]
            assert all(len(s) == (1 if spec.reads == "final" else 2) for s in steps)
            traj = assemble(heads[a:z], steps, [latent[(a + i, s)] for i, k in enumerate(steps) for s in k])
            traj.advantages = ADV[a:z].clone()
            split.accumulate(traj, [t], spec, total_samples=4, total_steps=len(slots), rows=slice(*mine))
    torch.testing.assert_close(_grads(split), _grads(whole), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("loss,spec", [("grpo-guard", WINDOW), ("nft", dataclasses.replace(CLEAN, draw_levels=0))])
def test_no_host_read_inside_a_pass_on_lean_trajectories(monkeypatch, loss, spec):
    """Lean latents are looked up without reading a value back to the host inside a pass (the
    unit's latents are checked once, before its passes): test_packed_passes' counter, lean."""
    policy = tiny_policy()
    lean = ship(_batch(policy, spec), spec)
    reads, _ = count_host_reads_in_passes(monkeypatch)
    learner = Learner(policy, LearnerConfig(loss=loss, beta=0.1 if loss == "grpo-guard" else 0.0))
    learner.accumulate(lean, list(spec.trained_slots), spec, total_samples=4, total_steps=2)
    assert reads == []
