"""The default run learns: held-out reward rises clearly above the base model's.

Marked slow (a full default run in one process: ~3 minutes on one core). Measured with
`python benchmarks/held_out_gain.py run.threads=1` (the same run as this test, one thread)
on 2026-12-01: held-out toy-geneval 0.597 -> 0.815 after the default 160 steps, strict
rate 4.2% -> 9.2%, over 120 samples.

"Clearly" is a paired test: evaluation uses the same prompts and the same initial noise
before and after training, so per-sample differences are compared with their own spread.
The floors are issue 14's target for the default run (+0.10, paired t > 5), not the value
measured here: the run is seeded and deterministic on one machine, but float rounding on
another CPU or thread count changes the RL trajectory (the Ray run of the same config
reached +0.153, t = 5.2, README).
"""

import json
from pathlib import Path

import pytest

from digenrl.config.schema import load_config
from digenrl.train.trainer import Trainer

MIN_GAIN = 0.10  # absolute, on a reward in [0, 1]
MIN_T = 5.0
NFT_MIN_GAIN, NFT_MIN_T = 0.03, 3.0  # the DiffusionNFT recipe keeps the earlier floors
RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def _held_out_gain(tmp_path, config=None):
    """(before, after, paired t) of held-out toy-geneval over one run of `config`."""
    cfg = load_config(config, [f"run.run_dir={tmp_path}", "run.mode=local", "run.tensorboard=false"])
    trainer = Trainer(cfg, progress=False)
    trainer.evaluate(0, save_images=False)
    before = trainer.last_eval_rewards.clone()
    summary = trainer.train()
    after = trainer.last_eval_rewards
    diff = after - before
    t = diff.mean() / (diff.std() / len(diff) ** 0.5)
    print(json.dumps({"config": str(config), "before": before.mean().item(), "after": after.mean().item(),
                      "t": t.item()}))
    assert summary["eval_reward_before"] == pytest.approx(before.mean().item(), abs=1e-6)
    return before, after, t


@pytest.mark.slow
def test_default_run_beats_the_base_model_on_held_out_prompts(tmp_path):
    before, after, t = _held_out_gain(tmp_path)
    diff = after - before
    assert diff.mean() > MIN_GAIN, f"held-out reward {before.mean():.4f} -> {after.mean():.4f}"
    assert t > MIN_T, f"gain {diff.mean():.4f} is not clear of noise (paired t = {t:.2f})"
    assert (tmp_path / "reward_curve.png").exists()


@pytest.mark.slow
def test_diffusionnft_run_beats_the_base_model_on_held_out_prompts(tmp_path):
    """recipes/toy_nft.yaml: DiffusionNFT on ODE rollouts, the default run otherwise. Measured
    with `python benchmarks/held_out_gain.py run.threads=1` and the recipe's keys (1 thread):
    0.597 -> 0.695 (+0.099, paired t = 3.72 over 120 samples) at the recipe's lr 3e-4."""
    before, after, t = _held_out_gain(tmp_path, RECIPES / "toy_nft.yaml")
    diff = after - before
    assert diff.mean() > NFT_MIN_GAIN, f"held-out reward {before.mean():.4f} -> {after.mean():.4f}"
    assert t > NFT_MIN_T, f"gain {diff.mean():.4f} is not clear of noise (paired t = {t:.2f})"
