"""train.loss=dpo and train.loss=flow-dppo in the Learner: a unit's gradient is the cited
formula on the unit's pairs (dpo) or units (flow-dppo), and rank shares add up to the whole."""

from __future__ import annotations

import pytest
import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import dpo_loss, flow_matching_error
from digenrl.models.lora import adapters_disabled
from digenrl.rollout.sampler import forward_targets

from .tiny_setup import SPEC, four_sample_batch, tiny_policy


def _grads(learner):
    return torch.cat([p.grad.flatten() for p in learner.params])


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_dpo_unit_is_the_formula_on_its_pairs(lora_rank):
    # ADVANTAGES = [1, -1, 0.5, -2] in groups (0, 1), (2, 3): best-worst pairs (0, 1) and (2, 3);
    # each pair noised with its winner's forward noise and level; the reference is the base
    # (LoRA: adapters off; full fine-tune: a frozen copy). Weight: 2 pairs x group size 2 / 4 = 1.
    policy = tiny_policy(lora_rank=lora_rank)
    traj = four_sample_batch(policy)
    learner = Learner(policy, LearnerConfig(loss="dpo", dpo_beta=50.0))
    learner.accumulate(traj, [1], SPEC, total_samples=4, total_steps=1)
    got = _grads(learner)
    learner.optimizer.zero_grad(set_to_none=True)
    base = tiny_policy()  # the same start weights, without adapters
    rows = torch.tensor([0, 2, 1, 3])
    coords = [traj.coords[0], traj.coords[2]] * 2
    x0 = traj.latents[rows, SPEC.num_steps]
    x_t, sigma = forward_targets(x0, SPEC, coords, 1)
    cond = {k: v[rows] for k, v in traj.cond.items()}
    with torch.no_grad():
        if lora_rank:
            with adapters_disabled(policy.module):
                v_ref = policy.velocity(x_t, sigma, cond)
        else:
            v_ref = base.velocity(x_t, sigma, cond)
    v = policy.velocity(x_t, sigma, cond)
    loss, _ = dpo_loss(flow_matching_error(v, x_t, x0, sigma), flow_matching_error(v_ref, x_t, x0, sigma), beta=50.0)
    loss.backward()
    torch.testing.assert_close(got, _grads(learner), rtol=1e-5, atol=1e-8)
    assert got.abs().max() > 0


def test_dpo_rank_shares_add_up_to_the_whole_unit():
    # a gang rank trains the pairs whose winner lies in its rows: shares [0, 1) + [1, 4) hold
    # winners 0 and 2, and their gradients sum to the whole unit's
    policy = tiny_policy(lora_rank=4)
    traj = four_sample_batch(policy)
    whole = Learner(policy, LearnerConfig(loss="dpo"))
    whole.accumulate(traj, [0, 1], SPEC, total_samples=4, total_steps=2)
    want = _grads(whole).clone()
    whole.zero_grad()
    for rows in (slice(0, 1), slice(1, 4)):
        whole.accumulate(traj, [0, 1], SPEC, total_samples=4, total_steps=2, rows=rows)
    torch.testing.assert_close(_grads(whole), want, rtol=1e-5, atol=1e-9)
    whole.zero_grad()
    whole.accumulate(traj, [0], SPEC, total_samples=4, total_steps=1, rows=slice(1, 2))  # loser only: no pair
    assert all(p.grad is None or not p.grad.any() for p in whole.params)


def test_dpo_refuses_backward_batch():
    with pytest.raises(ValueError, match="backward_batch"):
        LearnerConfig(loss="dpo", backward_batch=2)


def test_flow_dppo_on_policy_trains_as_grpo():
    # one optimizer step per RL step: the rollout's weights score the unit, D = 0 (below 1e-5),
    # nothing is dropped, and the gradient is grpo's (whose clip does not act at ratio 1)
    grads, metrics = [], {}
    for loss in ("flow-dppo", "grpo"):
        policy = tiny_policy()
        learner = Learner(policy, LearnerConfig(loss=loss))
        learner.accumulate(four_sample_batch(policy), [0, 1], SPEC, total_samples=4, total_steps=2)
        grads.append(_grads(learner).clone())
        metrics[loss] = learner.optimizer_step()
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-9)
    assert metrics["flow-dppo"]["loss/dppo_masked_frac"] == 0.0
    assert metrics["flow-dppo"]["loss/dppo_divergence_max"] < 1e-5


def test_flow_dppo_drops_a_unit_moving_away_past_the_threshold():
    # after one update the recorded step is off-policy (as at lag 1): units whose divergence is
    # past a tiny threshold and whose ratio moves with their advantage are dropped
    policy = tiny_policy()
    traj = four_sample_batch(policy)
    learner = Learner(policy, LearnerConfig(loss="flow-dppo", lr=1e-2, kl_mask_threshold=1e-12))
    learner.accumulate(traj, [0, 1], SPEC, total_samples=4, total_steps=2)
    learner.optimizer_step()
    learner.accumulate(traj, [0, 1], SPEC, total_samples=4, total_steps=2)
    m = learner.optimizer_step()
    assert m["loss/dppo_high_frac"] == 1.0 and 0 < m["loss/dppo_masked_frac"] <= 1.0
