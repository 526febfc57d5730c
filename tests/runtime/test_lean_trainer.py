"""Lean trainer ranks: a trainer rank holds the policy and its optimizer; its rewarder (and the
evaluator) exist only where trainers score: they generate (colocated, TAG) and no reward pool
takes the Reward units (workers.trainer_rewards). Elsewhere they are built at first use (a lost
rollout worker's re-queued Reward, trainer 0 evaluating when no device is free for the
evaluation actor)."""

from __future__ import annotations

import pytest

from digenrl.config.schema import load_config
from digenrl.runtime.workers import trainer_rewards
from digenrl.train.trainer import Trainer

from .conftest import tiny


@pytest.mark.parametrize("mode, extra, scores", [
    ("gap+tsp", [], False),  # rollout workers generate and score
    ("gap+tsp+tag", [], True),  # idle trainers generate, and score what they generated
    ("gap+tsp+tag", ["runtime.reward.workers=1"], False),  # ... unless a reward pool scores
    ("colocated", [], True),
])
def test_trainer_rewards_where_trainers_score(tmp_path, mode, extra, scores):
    assert trainer_rewards(load_config(None, tiny(tmp_path, mode, *extra))) is scores


@pytest.mark.slow  # a whole Trainer (policy, prompts, recorder): seconds on a busy CPU
def test_a_lean_trainer_builds_its_rewarder_and_evaluator_at_first_use(tmp_path):
    trainer = Trainer(load_config(None, tiny(tmp_path, "gap+tsp")), progress=False, lean=True)
    assert trainer._rewarder is None and trainer._evaluator is None
    assert trainer.evaluator.rewarder is trainer.rewarder is trainer._rewarder  # built once, shared
    trainer.close()
