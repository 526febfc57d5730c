"""What the diffusers-adapter tests share (a helper module, not tests): the tiny pipeline
folders and policies, a Flow-GRPO rollout, one GRPO train step, and the rollout / decode /
LoRA step / weight sync check every family passes."""

from __future__ import annotations

from pathlib import Path

import torch

from digenrl.math import grpo_loss, sde_step, sigma_schedule
from digenrl.models.diffusers_adapters import load_policy
from digenrl.models.lora import load_trainable_state_dict, trainable_state_dict
from digenrl.models.protocol import cond_repeat
from tests.models.tiny_diffusers import fake_text_cond

PROMPTS = ["a red cat", "a dog"]
GROUP = 2
NUM_STEPS = 3


def tiny_folder(setups: dict, folders: dict, tmp_path_factory, family: str) -> Path:
    """The family's tiny pipeline folder (setups: FAMILY_SETUPS or NEW_SETUPS), built once per
    `folders` dict (a module-scoped fixture, tests/models/conftest.py)."""
    if family not in folders:
        folders[family] = setups[family][0](tmp_path_factory.mktemp(family.replace("-", "_").replace(".", "")))
    return folders[family]


def load_tiny(setups: dict, folders: dict, tmp_path_factory, family: str, cache_dir: Path, **extra):
    """load_policy on the family's tiny folder; cache-fed families get their fake embeddings."""
    _, opts, shapes = setups[family]
    path = tiny_folder(setups, folders, tmp_path_factory, family)
    policy = load_policy(family, str(path), prompt_cache_dir=str(cache_dir), **{**opts, **extra})
    if shapes is not None:
        for prompt in [*PROMPTS, ""]:
            policy.cache.put(prompt, fake_text_cond(shapes, prompt))
    return policy


def rollout(policy, cond, seed: int = 0):
    """Flow-GRPO sampling: flow-sde on every step but the last (ODE). Returns latents, logps."""
    batch = next(iter(cond.values())).shape[0]
    g = torch.Generator().manual_seed(seed)
    sigmas = sigma_schedule(NUM_STEPS, shift=3.0)
    x = torch.randn(batch, *policy.latent_shape, generator=g)
    latents, logps = [x], []
    with torch.no_grad():
        for i in range(NUM_STEPS):
            v = policy.velocity(x, sigmas[i].expand(batch), cond)
            kind = "flow-sde" if i < NUM_STEPS - 1 else "ode"
            out = sde_step(x, v, sigmas[i], sigmas[i + 1], kind=kind, noise_level=0.7, generator=g)
            x = out.prev_sample
            latents.append(x)
            logps.append(out.log_prob)
    return torch.stack(latents, 1), logps  # (B, NUM_STEPS + 1, *latent_shape)


def train_step(policy, cond, latents, logps, step: int, optimizer):
    """Recompute logp of one trained step with grad, GRPO loss, backward, optimizer step."""
    sigmas = sigma_schedule(NUM_STEPS, shift=3.0)
    batch = latents.shape[0]
    x, x_next = latents[:, step], latents[:, step + 1]
    v = policy.velocity(x, sigmas[step].expand(batch), cond)
    out = sde_step(x, v, sigmas[step], sigmas[step + 1], kind="flow-sde", noise_level=0.7, prev_sample=x_next)
    logp_old = logps[step]
    advantages = torch.linspace(-1.0, 1.0, batch)
    loss, metrics = grpo_loss(out.log_prob, logp_old, advantages, clip_range=1e-4)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return out.log_prob.detach(), logp_old, metrics


def check_rollout_decode_step_and_sync(policy, reload) -> None:
    """A group rollout has finite log-probs (none for the last, ODE step), decodes to (4, 3,
    H, W) images or (4, 5, 3, H, W) videos in [0, 1] (the policy's size), then
    `check_lora_step_and_sync`."""
    cond = cond_repeat(policy.encode_prompts(PROMPTS), GROUP)  # (B = 4, ...)
    latents, logps = rollout(policy, cond)  # wan2.2: sigmas 1, 0.9 high expert; 0.75 low
    assert all(torch.isfinite(lp).all() for lp in logps[:-1]) and logps[-1] is None

    pixels = policy.decode(latents[:, -1])
    hw = (policy.height, policy.width)
    expected = (4, 3, *hw) if policy.output == "image" else (4, 5, 3, *hw)
    assert pixels.shape == expected and pixels.dtype == torch.float32
    assert 0.0 <= pixels.min() and pixels.max() <= 1.0

    check_lora_step_and_sync(policy, cond, latents, logps, reload)


def check_full_finetune_step(policy, cond=None) -> None:
    """A full fine-tune (`train="full"`, gradient checkpointing on): one rollout and one SGD step
    recompute the rollout's log-probs exactly (checkpointed recomputation too), every parameter
    is trainable, and an attention weight moves. cond: a conditioned family's rows (default: the
    prompts, GROUP samples each)."""
    assert policy.module.gradient_checkpointing
    cond = cond_repeat(policy.encode_prompts(PROMPTS), GROUP) if cond is None else cond
    latents, logps = rollout(policy, cond)
    weight = next(p for n, p in policy.module.named_parameters() if n.endswith("to_q.weight"))
    w0 = weight.detach().clone()
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1e-1)
    logp, logp_old, _ = train_step(policy, cond, latents, logps, step=0, optimizer=optimizer)
    assert torch.equal(logp, logp_old)
    assert len(policy.trainable_parameters()) == len(list(policy.module.parameters()))
    assert not torch.equal(w0, weight.detach())


def check_per_row_timesteps(policy, cond, latents) -> None:
    """TSP's packed pass (learner.passes) puts pairs of several denoising steps in one batch,
    each row at its own timestep: the family's velocity of rows at different sigmas in one
    call equals each row's own call (no row reads another's timestep)."""
    batch = latents.shape[0]
    sigmas = sigma_schedule(batch, shift=3.0)[:batch]  # (B,) distinct, 1 -> small
    x = latents[:, 1]
    rows = lambda i: {k: (v[i : i + 1] if torch.is_tensor(v) and v.shape[:1] == (batch,) else v)
                      for k, v in cond.items()}
    with torch.no_grad():
        together = policy.velocity(x, sigmas, cond)
        alone = torch.cat([policy.velocity(x[i : i + 1], sigmas[i : i + 1], rows(i)) for i in range(batch)])
    assert torch.allclose(together, alone, atol=1e-5, rtol=1e-4), float((together - alone).abs().max())


def check_lora_step_and_sync(policy, cond, latents, logps, reload) -> None:
    """Each row takes its own timestep (`check_per_row_timesteps`); one LoRA train step on a
    rollout (ratio == 1, only adapters get gradients and move), then weight sync: `reload()`
    builds a second copy, which samples what the trained one does once it loads the adapters."""
    check_per_row_timesteps(policy, cond, latents)
    before = {k: v.clone() for k, v in trainable_state_dict(policy.module).items()}
    params = policy.trainable_parameters()
    assert params and all("lora_" in n for n, p in policy.module.named_parameters() if p.requires_grad)
    optimizer = torch.optim.Adam(params, lr=1e-2)
    logp, logp_old, metrics = train_step(policy, cond, latents, logps, step=1, optimizer=optimizer)

    # on-policy, before any update: the recomputation is bit-identical to the rollout
    assert torch.equal(logp, logp_old)
    assert float(metrics["loss/ratio_mean"]) == 1.0
    # LoRA: only adapters got gradients, and they moved
    for name, p in policy.module.named_parameters():
        if "lora_" not in name:
            assert p.grad is None, name
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    after = trainable_state_dict(policy.module)
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # weight sync: a second copy loads the adapters and now samples what the trained one does
    copy = reload()
    stale, _ = rollout(copy, cond, seed=1)
    load_trainable_state_dict(copy.module, trainable_state_dict(policy.module))
    synced, _ = rollout(copy, cond, seed=1)
    trained, _ = rollout(policy, cond, seed=1)
    assert not torch.equal(stale[:, -1], synced[:, -1])
    assert torch.equal(synced, trained)


def assert_lora_landed(module: torch.nn.Module, targets, prefixes=("",)) -> None:
    """peft skips target names a model lacks without a word: every default target must have
    been found (under each prefix, e.g. each trained expert)."""
    adapted = {n[: -len(".lora_A.default.weight")] for n, _ in module.named_parameters()
               if n.endswith(".lora_A.default.weight")}
    for prefix in prefixes:
        for target in targets:
            assert any(n.startswith(prefix) and n.endswith("." + target) for n in adapted), (prefix, target)


def assert_blocks_are_fsdp_units(module: torch.nn.Module) -> None:
    """shard_policy wraps each block `transformer_blocks` finds: it must find every block of the
    family's transformer, in forward order (else the whole model is one unit, gathered whole)."""
    from digenrl.learner.sharded import transformer_blocks

    expected = list(module.transformer_blocks) + list(getattr(module, "single_transformer_blocks", []))
    blocks = transformer_blocks(module)
    assert len(blocks) == len(expected) >= 1 and all(a is b for a, b in zip(blocks, expected))
    block_params = {id(p) for b in blocks for p in b.parameters()}
    assert all(".transformer_blocks." not in f".{n}" for n, p in module.named_parameters()
               if id(p) not in block_params)
