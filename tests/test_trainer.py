"""The single-device trainer: on-policy ratio, resume, outputs, determinism."""

import json

import pytest
import torch
from safetensors.torch import load_file

from digenrl.config.schema import load_config
from digenrl.io.outputs import REQUIRED_KEYS, read_metrics
from digenrl.rollout import generate
from digenrl.train.trainer import Trainer, assign_advantages, plan_step


@pytest.mark.parametrize("lora", [False, True])
def test_first_update_sees_ratio_exactly_one(tiny_overrides, lora):
    extra = ["model.lora_rank=4"] if lora else ["model.lora_rank=0"]
    trainer = Trainer(load_config(None, tiny_overrides + extra + ["train.beta=0.01"]), progress=False)
    plan = plan_step(trainer.cfg, trainer.source, 0)
    trajs = []
    for mb in plan.micro_batches:
        traj = generate(trainer.policy, mb.prompts, mb.coords, plan.spec, step=0, version=0)
        traj.rewards, traj.reward_parts = trainer.rewarder.score(traj.images, traj.prompts, traj.group_ids)
        trajs.append(traj)
    assign_advantages(trajs, trainer.cfg)
    for t in plan.trained_steps:
        out = trainer.learner.score(trajs[0], t, plan.spec)
        assert torch.equal(out.log_prob.detach(), trajs[0].log_probs[:, t]), f"ratio != 1 at denoising step {t}"
    for traj in trajs:
        trainer.learner.accumulate(traj, plan.trained_steps, plan.spec, total_samples=plan.samples,
                                   total_steps=len(plan.trained_steps))
    m = trainer.learner.optimizer_step()
    assert m["loss/ratio_mean"] == 1.0 and m["loss/ratio_max"] == 1.0 and m["loss/clipfrac"] == 0.0
    assert m["train/grad_norm"] > 0
    # the consistency monitor: rollout and trainer at one precision, the same weights: no gap
    assert m["consistency/gap_abs_max"] == 0.0 and m["consistency/past_clip"] == 0.0


def test_lora_trains_only_adapters(tiny_overrides):
    trainer = Trainer(load_config(None, tiny_overrides + ["model.lora_rank=4", "train.steps=1",
                                                          "run.eval_every=0"]), progress=False)
    before = {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}
    trainer.rl_step(0)
    after = trainer.policy.module.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)


@pytest.mark.parametrize("rank", [0, 4], ids=["full", "lora"])
def test_run_outputs_and_resume_equality(tiny_overrides, tmp_path, rank):
    base = tiny_overrides + [f"model.lora_rank={rank}", "train.steps=4", "run.checkpoint_every=2", "run.eval_every=2", "train.ema_decay=0.9"]
    full = load_config(None, [o.replace(str(tmp_path / "run"), str(tmp_path / "full")) for o in base])
    Trainer(full, progress=False).train()

    # interrupted run: stop after 2 steps (checkpoint at 2), then --resume to 4
    part = load_config(None, [o.replace(str(tmp_path / "run"), str(tmp_path / "part")) for o in base])
    part.train.steps = 2
    Trainer(part, progress=False).train()
    part.train.steps = 4
    Trainer(part, progress=False).train(resume=True)

    wa = load_file(str(tmp_path / "full" / "final" / "policy.safetensors"))
    wb = load_file(str(tmp_path / "part" / "final" / "policy.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ea = load_file(str(tmp_path / "full" / "final" / "ema.safetensors"))
    eb = load_file(str(tmp_path / "part" / "final" / "ema.safetensors"))
    assert all(torch.equal(ea[k], eb[k]) for k in ea)

    def comparable(run):
        return [{k: v for k, v in r.items() if not k.startswith("timing/") and k not in ("wall_s", "samples_per_s", "step_s")}
                for r in read_metrics(tmp_path / run)]

    assert comparable("full") == comparable("part")
    records = read_metrics(tmp_path / "full")
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert set(REQUIRED_KEYS) <= set(r)
    run = tmp_path / "full"
    for f in ("reward_curve.png", "summary.json", "config.json", "samples/step_000004.png", "final/policy.safetensors"):
        assert (run / f).exists(), f
    state = json.loads((run / "checkpoints" / "step_000004" / "state.json").read_text())
    assert state["step"] == 4 and state["data_cursor"] == 4 * 4


def test_same_seed_same_run_different_seed_differs(tiny_overrides):
    def one_step(seed):
        t = Trainer(load_config(None, tiny_overrides + [f"run.seed={seed}"]), progress=False)
        t.rl_step(0)
        return {k: v.clone() for k, v in t.policy.module.state_dict().items()}

    a, b, c = one_step(0), one_step(0), one_step(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_micro_batch_layout_does_not_change_trajectories(tiny_overrides):
    t = Trainer(load_config(None, tiny_overrides), progress=False)
    plan = plan_step(t.cfg, t.source, 3)
    whole = [c for mb in plan.micro_batches for c in mb.coords]
    prompts = [p for mb in plan.micro_batches for p in mb.prompts]
    together = generate(t.policy, prompts, whole, plan.spec, step=3, version=3)
    mb = plan.micro_batches[1]
    alone = generate(t.policy, mb.prompts, mb.coords, plan.spec, step=3, version=3)
    n = len(plan.micro_batches[0].coords)
    # same noise and same decisions per sample; values equal up to batch-size-dependent kernels
    assert torch.allclose(together.latents[n:], alone.latents, atol=1e-5)


@pytest.mark.parametrize("loss", ["grpo", "grpo-guard"])  # guard: no statistic spans the rows of a unit
def test_backward_batch_splits_give_the_same_update(tiny_overrides, loss):
    def one_step(extra):
        t = Trainer(load_config(None, tiny_overrides + extra + [f"train.loss={loss}"]), progress=False)
        t.rl_step(0)
        return {k: v.clone() for k, v in t.policy.module.state_dict().items()}

    whole, split = one_step([]), one_step(["train.backward_batch=3"])
    # Adam's first step is ~lr * sign(grad): rounding of near-zero gradients shows at ~3e-6 (lr 1e-3)
    assert all(torch.allclose(whole[k], split[k], atol=1e-5) for k in whole)
    assert any(float(v.abs().max()) > 5e-4 for k, v in whole.items() if "lora_B" in k)  # it did update


def test_grad_ckpt_keeps_ratio_exactly_one(tiny_overrides):
    # checkpointing recomputes block activations in backward: the forward values must not change
    trainer = Trainer(load_config(None, tiny_overrides + ["model.lora_rank=4", "model.grad_ckpt=true"]),
                      progress=False)
    assert trainer.policy.module.grad_ckpt
    plan = plan_step(trainer.cfg, trainer.source, 0)
    mb = plan.micro_batches[0]
    traj = generate(trainer.policy, mb.prompts, mb.coords, plan.spec, step=0, version=0)
    trainer.policy.module.train()  # as the learner does: the checkpointed path
    for t in plan.trained_steps:
        out = trainer.learner.score(traj, t, plan.spec)
        assert torch.equal(out.log_prob.detach(), traj.log_probs[:, t]), f"ratio != 1 at denoising step {t}"


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_one_rl_step_on_cuda_sees_ratio_exactly_one(tiny_overrides, lora):
    # the same kernels in rollout (no grad) and training (grad) on the GPU: ratio 1, not ~1
    extra = ["model.device=cuda", "model.lora_rank=4" if lora else "model.lora_rank=0", "train.beta=0.01"]
    trainer = Trainer(load_config(None, tiny_overrides + extra), progress=False)
    assert all(p.is_cuda for p in trainer.policy.module.parameters())
    before = {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}
    m = trainer.rl_step(0)
    assert m["loss/ratio_mean"] == 1.0 and m["loss/ratio_max"] == 1.0 and m["loss/clipfrac"] == 0.0, m
    assert 0 < m["train/grad_norm"] < float("inf") and m["train/skipped_step"] == 0.0
    after = trainer.policy.module.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the optimizer step changed nothing"


@pytest.mark.gpu
@needs_cuda
def test_local_run_on_cuda_writes_outputs_and_resumes(tiny_overrides, tmp_path):
    # evaluation, checkpoints and final weights from CUDA tensors; --resume loads them back onto CUDA
    cfg = load_config(None, tiny_overrides + ["model.device=cuda", "train.steps=2", "run.checkpoint_every=1",
                                              "run.eval_every=1"])
    summary = Trainer(cfg, progress=False).train()
    run = tmp_path / "run"
    assert summary["steps"] == 2 and (run / "final" / "policy.safetensors").exists()
    assert len(read_metrics(run)) == 3  # step 0 eval, then two RL steps
    cfg.train.steps = 3
    resumed = Trainer(cfg, progress=False)
    assert resumed.train(resume=True)["steps"] == 3
    assert all(p.is_cuda for p in resumed.policy.module.parameters())


NFT_DECAY = ["train.loss=nft", "sampling.sde=ode", "sampling.window_draw=sample", "model.lora_rank=4",
             "train.nft_decay=0.5", "train.nft_decay_rate=0.25", "train.nft_beta=0.5", "run.eval_every=0",
             "data.groups_per_step=2", "data.group_size=2", "data.micro_batch_groups=1", "sampling.num_steps=4",
             "data.eval_max_prompts=1", "data.eval_samples=1", "sampling.eval_num_steps=2"]


def test_nft_old_policy_samples_and_resumes_exactly(tiny_overrides, tmp_path, monkeypatch):
    """train.nft_decay: each step's rollouts come from DiffusionNFT's old policy (not the live
    weights), and its weights go into checkpoints: 1 step + --resume to 2 == 2 steps."""
    import digenrl.train.trainer as trainer_module

    base = tiny_overrides + NFT_DECAY + ["train.steps=2", "run.checkpoint_every=1"]
    made = {}  # (step, micro-batch coords) -> the trajectory the trainer generated
    real_generate = trainer_module.generate

    def recording(policy, prompts, coords, *args, **kwargs):
        traj = real_generate(policy, prompts, coords, *args, **kwargs)
        made[(kwargs["step"], tuple(coords))] = traj
        return traj

    monkeypatch.setattr(trainer_module, "generate", recording)
    ref = load_config(None, [o.replace(str(tmp_path / "run"), str(tmp_path / "ref")) for o in base])
    Trainer(ref, progress=False).train()
    monkeypatch.setattr(trainer_module, "generate", real_generate)

    # the weights after step 1 (checkpoint): step 2's rollouts are the old policy's, not the live one's
    after1 = Trainer(ref, progress=False)
    after1.load(tmp_path / "ref" / "checkpoints" / "step_000001")
    old = after1.learner.old.state_dict()
    assert any(not torch.equal(old[n], p) for n, p in after1.learner.old.params.items())  # d = 0.25: it lags
    plan = plan_step(ref, after1.source, 1)
    mb = plan.micro_batches[0]
    with after1.learner.sampling_weights():
        by_old = real_generate(after1.policy, mb.prompts, mb.coords, plan.spec, step=1, version=1)
    by_live = real_generate(after1.policy, mb.prompts, mb.coords, plan.spec, step=1, version=1)
    assert torch.equal(made[(1, tuple(mb.coords))].latents, by_old.latents)
    assert not torch.allclose(by_old.latents, by_live.latents)

    # resume: 1 step, then --resume to 2 (the old policy read back) == the 2-step run
    part = load_config(None, [o.replace(str(tmp_path / "run"), str(tmp_path / "part")) for o in base])
    part.train.steps = 1
    Trainer(part, progress=False).train()
    part.train.steps = 2
    Trainer(part, progress=False).train(resume=True)
    for f in ("final/policy.safetensors", "checkpoints/step_000002/old_policy.safetensors"):
        wa, wb = load_file(str(tmp_path / "ref" / f)), load_file(str(tmp_path / "part" / f))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), f
