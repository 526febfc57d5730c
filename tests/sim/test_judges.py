"""A generative judge priced from first principles (catalogue.JUDGES, costs.judge_*): prefill FLOPs,
decode = the longest answer's tokens x a step that reads every LM weight once (+ eager launches)."""

import math

import pytest

from digenrl.sim.catalogue import EAGER_LAYER_S, JUDGES, Shape, longest_answer
from digenrl.sim.costs import CostModel, JudgeServing
from digenrl.sim.shipped import SYSTEMS, step_costs
from digenrl.sim.testbed import Testbed, TestbedError

J = JUDGES["qwen3-vl-8b"]


@pytest.fixture(scope="module")
def cm():
    return CostModel()


def test_decode_step_by_hand(cm):
    """Qwen3-VL-8B on 4 H100, eager: 8.19e9 x 2 B / 4 over 3.35 TB/s = 1.222 ms, + 2 x 36 all-reduces
    x 10 us (NVLink latency) = 0.72 ms, + 36 layers x 0.34 ms = 12.24 ms: 14.18 ms a token."""
    assert float(cm.judge_token_s("qwen3-vl-8b", "H100", tp=4, eager=True)) == pytest.approx(14.18e-3, rel=1e-3)
    # CUDA graphs on one H200: the weight read alone, 16.38 GB / 4.8 TB/s
    assert float(cm.judge_token_s("qwen3-vl-8b", "H200")) == pytest.approx(3.4125e-3, rel=1e-3)
    eager = float(cm.judge_token_s("qwen3-vl-8b", "H200", eager=True)) - float(cm.judge_token_s("qwen3-vl-8b", "H200"))
    assert eager == pytest.approx(36 * EAGER_LAYER_S)


def test_the_longest_answer_grows_with_the_batch_and_stops_at_max_tokens():
    assert longest_answer(J, 1) == pytest.approx(J.answer_tokens)
    assert longest_answer(J, 2) == pytest.approx(1.5 * J.answer_tokens)  # H(2)
    assert longest_answer(J, 512) == pytest.approx(J.answer_tokens * sum(1 / k for k in range(1, 513)))
    assert longest_answer(J, 10**6) == pytest.approx(J.answer_tokens * (math.log(1e6) + 0.5772), rel=1e-3)
    assert longest_answer(J, 512, max_tokens=50) == 50
    assert longest_answer(J, 0) == 0


def test_prefill_counts_the_image_tokens(cm):
    """512x512: (512 / 32)^2 = 256 LM tokens (patch 16, 2x2 merge), the ViT over 1024 patches."""
    assert J.image_tokens(Shape(512, 512)) == 256
    assert J.prefill_flops(Shape(512, 512)) == pytest.approx(2e9 * (8.19 * 296 + 0.58 * 1024))
    assert J.prefill_flops(Shape(1024, 1024)) == pytest.approx(2e9 * (8.19 * (1024 + 40) + 0.58 * 4096))
    a = float(cm.reward_model_s("qwen3-vl-8b", "H200", 8, Shape(512, 512), JudgeServing(decode=False)))
    b = float(cm.reward_model_s("qwen3-vl-8b", "H200", 8, Shape(512, 512), JudgeServing(max_tokens=4096)))
    assert b - a == pytest.approx(float(cm.judge_decode_s("qwen3-vl-8b", "H200", 8, JudgeServing(max_tokens=4096))))


def _ocr(gpus: int, **kw) -> Testbed:
    d = dict(name="t", pools=[dict(name="p", count=gpus, device="H100", role="any", gpus_per_node=8)],
             model="qwen-image-20b", height=512, width=512, denoise_steps=10, trained_steps=2, group_size=16,
             groups_per_step=32, micro_batch=16, rollout_batch=1, reward="qwen3-vl-8b", judge_max_tokens=4096,
             judge_eager=True, judge_tp=4)
    return Testbed.from_dict({**d, **kw})


def test_a_reward_phase_waits_for_its_longest_answer_at_any_cluster_size(cm):
    """veRL-Omni's reward phase: the step's 512 answers decode together, so the judge's decode is the
    same on 4 GPUs and on 64 (it does not divide over them, unlike its prefill)."""
    vo = SYSTEMS["verl-omni@2026-06"]
    small = step_costs(cm, vo, _ocr(4), "H100", 4, "nvlink")["judge_decode"]
    large = step_costs(cm, vo, _ocr(64), "H100", 64, "ib-400g")["judge_decode"]
    assert small == large == pytest.approx(longest_answer(J, 512, 4096) * 14.18e-3, rel=1e-3)
    # the reward model's wake and sleep: one server's share (judge_tp GPUs), not the world's
    assert step_costs(cm, vo, _ocr(64), "H100", 64, "ib-400g")["reward_moves"] == pytest.approx(
        step_costs(cm, vo, _ocr(4), "H100", 4, "nvlink")["reward_moves"])


def test_judge_keys_are_refused_on_a_reward_that_is_not_a_judge():
    for key, value in (("judge_eager", True), ("judge_max_tokens", 64), ("judge_tp", 2)):
        with pytest.raises(TestbedError, match=key):
            _ocr(4, reward="pickscore", **{k: v for k, v in (("judge_max_tokens", None), ("judge_eager", False),
                                                               ("judge_tp", 1)) if k != key}, **{key: value})
    with pytest.raises(TestbedError, match="judge_tp"):
        _ocr(4, judge_tp=0)
