"""The TAG switch (digenrl/runtime/tag_switch.py): a helper Generate in the middle of an RL
step, over accumulated gradients, leaves the trainer bit for bit where it was.

The reference runs two RL steps of two Train units each, then an optimizer step. The switched
run does the same with a TAG Generate between the two units of every step (the second step's
switch also moves AdamW state). Weights, optimizer state and step metrics must be torch.equal.
A corrupted restore must be caught by the same comparison (test_a_corrupted_restore_is_caught).
"""

from __future__ import annotations

import pytest
import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import sigma_schedule
from digenrl.math.grad_sum import grad_sum_bytes
from digenrl.rollout import SampleSpec, advance, start
from digenrl.runtime.tag_switch import TagSwitch
from digenrl.sim.tag_switch import must_offload, reload_bytes, switch_bytes

from tests.learner.tiny_setup import tiny_policy

SPEC = SampleSpec(sigmas=sigma_schedule(3, 1.0), sde_steps=(0, 1))
UNITS = ([0], [1])  # a step's two Train units: trained slot 0, then slot 1
PROMPTS = ["a red circle", "a red circle", "a blue square", "a blue square"]


def micro_batch(policy, step: int):
    coords = [(step, g, s) for g in range(2) for s in range(2)]
    with torch.no_grad():
        traj = advance(policy, start(policy, PROMPTS, coords, SPEC, step=step, version=step), SPEC)
    traj.advantages = torch.tensor([1.0, -1.0, 0.5, -2.0])
    return traj


def helper_generate(policy, learner):
    """What TrainerRank.generate runs inside the switch: a Generate with the sampling weights."""
    with learner.sampling_weights(), torch.no_grad():
        policy.module.eval()
        advance(policy, start(policy, PROMPTS[:2], [(9, 0, 0), (9, 0, 1)], SPEC, step=9, version=0), SPEC)


def run(lora: int, switch_cls=None, policy_key: str = "always", steps: int = 2, **config):
    """Two RL steps; with `switch_cls`, a switched Generate between each step's Train units.
    Returns (weights, optimizer state, per-step metrics, the switch)."""
    policy = tiny_policy(lora_rank=lora)
    learner = Learner(policy, LearnerConfig(lr=1e-2, **config))
    batches = [micro_batch(policy, s) for s in range(steps)]  # before any update: same in both runs
    switch = switch_cls(learner, policy_key) if switch_cls else TagSwitch(learner, "never")  # (a handle)
    metrics = []
    for s in range(steps):
        for i, slots in enumerate(UNITS):
            if i == 1 and switch_cls is not None:
                with switch.helper():
                    helper_generate(policy, learner)
            learner.accumulate(batches[s], slots, SPEC, total_samples=4, total_steps=2)
        metrics.append(learner.optimizer_step(version=s + 1))
    weights = {n: p.detach().clone() for n, p in policy.module.named_parameters()}
    opt = [{k: v.clone() for k, v in learner.optimizer.state[p].items()} for p in learner.params]
    return weights, opt, metrics, switch


def same(a, b) -> bool:
    wa, oa, ma, _ = a
    wb, ob, mb, _ = b
    return (wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa) and ma == mb
            and len(oa) == len(ob) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                           for x, y in zip(oa, ob)))


LORA = pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])


@LORA
@pytest.mark.parametrize("grad_sum", ["float64", "float32"])
def test_helper_restore_is_bit_exact(lora, grad_sum):
    ref = run(lora, grad_sum=grad_sum)
    switched = run(lora, TagSwitch, grad_sum=grad_sum)
    assert same(switched, ref)
    counts = switched[3].take()
    assert counts["tag/switches"] == 2 and counts["tag/offload_bytes"] > 0
    assert (counts["tag/reload_bytes"] > 0) == (lora == 0)  # a generation copy for a full fine-tune only


@LORA
def test_helper_restore_is_bit_exact_under_the_old_policy_swap(lora):
    """DiffusionNFT's old policy generates (sampling_weights swaps it into the module inside the
    switch, over a full fine-tune's generation copy): still bit-exact, old-policy shadows too."""
    ref = run(lora, loss="nft", nft_decay=0.5)
    switched = run(lora, TagSwitch, loss="nft", nft_decay=0.5)
    assert same(switched, ref)
    assert all(torch.equal(a, b) for a, b in zip(ref[3].learner.old.shadow.values(),
                                                 switched[3].learner.old.shadow.values()))


@LORA
@pytest.mark.parametrize("grad_sum", ["float64", "float32"])
def test_counted_bytes_are_the_formula_s(lora, grad_sum):
    """tag/offload_bytes = 2 x switch_bytes (out and back), reload = reload_bytes, per switch:
    the first switch (no optimizer step yet) moves no AdamW state, the second moves all of it."""
    policy = tiny_policy(lora_rank=lora)
    learner = Learner(policy, LearnerConfig(grad_sum=grad_sum))
    switch = TagSwitch(learner, "always")
    trainable = sum(p.numel() for p in learner.params)
    master = learner.params[0].element_size()
    assert all(p.element_size() == master for p in learner.params)
    expected = []
    for s in range(2):
        learner.accumulate(micro_batch(policy, s), [0], SPEC, total_samples=4, total_steps=2)
        assert all(p.grad is not None for p in learner.params)  # every trainable element moves
        with switch.helper():
            helper_generate(policy, learner)
        counts = switch.take()
        opt = 2 * trainable if s else 0
        one_way = switch_bytes(trainable=trainable, master_bytes=master, optimizer_elements=opt,
                               grad_sum_bytes=grad_sum_bytes(grad_sum, trainable), full_ft=lora == 0,
                               optimizer_steps=len(learner.params) if s else 0)  # (CPU: `step` is on the device)
        expected.append(one_way)
        assert counts["tag/switches"] == counts["tag/offloads"] == 1
        assert counts["tag/offload_bytes"] == 2 * one_way
        assert counts["tag/reload_bytes"] == reload_bytes(trainable=trainable, generation_bytes=master,
                                                         full_ft=lora == 0)
        learner.optimizer_step(version=s + 1)
    assert expected[1] > expected[0] > 0


@LORA
def test_nothing_moves_without_accumulated_gradients_or_with_never(lora):
    """A switch at a step boundary moves nothing; tag_offload=never moves nothing either, and the
    generation leaves p.grad, the sums, AdamW state, modes and requires_grad as training left them."""
    policy = tiny_policy(lora_rank=lora)
    learner = Learner(policy, LearnerConfig())
    switch = TagSwitch(learner, "always")
    with switch.helper():  # step 0, before any Train unit
        helper_generate(policy, learner)
    assert switch.last is None and switch.take()["tag/offload_bytes"] == 0
    learner.accumulate(micro_batch(policy, 0), [0], SPEC, total_samples=4, total_steps=2)
    learner.optimizer_step(version=1)
    with switch.helper():  # step 1's start: AdamW state exists, but no gradient: nothing moves
        helper_generate(policy, learner)
    counts = switch.take()
    assert switch.last is None and counts["tag/offload_bytes"] == counts["tag/offloads"] == 0
    assert counts["tag/switches"] == 1

    learner.accumulate(micro_batch(policy, 1), [0], SPEC, total_samples=4, total_steps=2)
    never = TagSwitch(learner, "never")
    policy.module.train()
    before = ([p.grad.clone() for p in learner.params], [s.clone() for s in learner.grads.sums],
              [{k: v.clone() for k, v in learner.optimizer.state[p].items()} for p in learner.params],
              [(m.training, [q.requires_grad for q in m.parameters(recurse=False)]) for m in policy.module.modules()])
    with never.helper():
        helper_generate(policy, learner)  # (sets eval mode: the switch puts train mode back)
    assert never.last is None and never.take()["tag/offload_bytes"] == 0
    assert all(torch.equal(a, p.grad) for a, p in zip(before[0], learner.params))
    assert all(torch.equal(a, b) for a, b in zip(before[1], learner.grads.sums))
    assert all(all(torch.equal(v, learner.optimizer.state[p][k]) for k, v in st.items())
               for st, p in zip(before[2], learner.params))
    assert before[3] == [(m.training, [q.requires_grad for q in m.parameters(recurse=False)])
                         for m in policy.module.modules()]


def test_the_offload_really_moves_the_bytes():
    """While the helper generates, the device tensors are gone: p.grad None, sums None, AdamW
    state None, and a full fine-tune's parameters are new tensors (the generation copy)."""
    policy = tiny_policy()
    learner = Learner(policy, LearnerConfig(grad_sum="float64"))
    learner.accumulate(micro_batch(policy, 0), [0], SPEC, total_samples=4, total_steps=2)
    learner.optimizer_step(version=1)
    learner.accumulate(micro_batch(policy, 1), [0], SPEC, total_samples=4, total_steps=2)
    switch = TagSwitch(learner, "always")
    ptrs = [p.data_ptr() for p in learner.params]
    with switch.helper():
        assert all(p.grad is None for p in learner.params) and all(s is None for s in learner.grads.sums)
        assert all(v is None for p in learner.params for v in learner.optimizer.state[p].values())
        assert all(p.data_ptr() != q for p, q in zip(learner.params, ptrs))
    assert all(h.host.data_ptr() != p.data_ptr() for p, h in switch.last.masters)  # separate host copies


class _Corrupt(TagSwitch):
    """A broken restore: one element of one kind of buffer comes back changed."""

    kind = ""

    def restore(self, moved):
        super().restore(moved)
        learner = self.learner
        with torch.no_grad():
            if self.kind == "masters":
                learner.params[0].view(-1)[0] += 1e-3
            elif self.kind == "grads":
                learner.params[0].grad.view(-1)[0] += 1e-3
            elif self.kind == "sums":
                learner.grads.sums[0].view(-1)[0] += 1e-3
            elif self.kind == "optimizer" and learner.optimizer.state[learner.params[0]]:
                learner.optimizer.state[learner.params[0]]["exp_avg"].view(-1)[0] += 1e-3


@pytest.mark.parametrize("kind,grad_sum,lora", [("masters", "float64", 0), ("grads", "float32", 4),
                                                ("sums", "float64", 4), ("optimizer", "float64", 4)])
def test_a_corrupted_restore_is_caught(kind, grad_sum, lora):
    """The comparison of test_helper_restore_is_bit_exact fails when any one buffer is restored
    wrong (p.grad only matters where it is the sum: grad_sum=float32)."""
    broken = type("Broken", (_Corrupt,), {"kind": kind})
    assert not same(run(lora, broken, grad_sum=grad_sum), run(lora, grad_sum=grad_sum))


def test_must_offload_rule():
    assert not must_offload("never", accumulated=True, on_gpu=True, resident_bytes=10**12, device_bytes=1)
    assert not must_offload("always", accumulated=False, on_gpu=True)
    assert must_offload("always", accumulated=True, on_gpu=False)
    assert not must_offload("auto", accumulated=True, on_gpu=False)  # a CPU's memory is the host's
    gib = 2**30  # 100 GiB device: usable 0.95 x 100 - 1 = 94 GiB
    assert not must_offload("auto", accumulated=True, on_gpu=True, resident_bytes=90 * gib,
                            generation_bytes=4 * gib, device_bytes=100 * gib)
    assert must_offload("auto", accumulated=True, on_gpu=True, resident_bytes=90 * gib,
                        generation_bytes=4 * gib + 1, device_bytes=100 * gib)
    with pytest.raises(ValueError, match="tag_offload"):
        must_offload("sometimes", accumulated=True, on_gpu=False)


def test_switch_bytes_by_hand():
    # LoRA, 1000 fp32 adapter elements, float64 sums, after a step (AdamW m, v): 4000 + 8000 + 8000
    assert switch_bytes(trainable=1000, master_bytes=4, optimizer_elements=2000, grad_sum_bytes=8,
                        full_ft=False) == 20_000
    # the same as a full fine-tune, float32 sums (p.grad is the sum), 3 step scalars on the device
    assert switch_bytes(trainable=1000, master_bytes=4, optimizer_elements=2000, grad_sum_bytes=4,
                        full_ft=True, optimizer_steps=3) == 4000 + 8000 + 12 + 4000
    assert reload_bytes(trainable=1000, generation_bytes=2, full_ft=True) == 2000
    assert reload_bytes(trainable=1000, generation_bytes=2, full_ft=False) == 0


# -- an FSDP2 gang of 2 gloo ranks: each rank moves its shards (DTensors), the masters stay ------
def _gang_worker(rank: int, tmp: str, lora: int) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from digenrl.learner.sharded import full_state_dict, shard_policy
    from digenrl.math.grad_sum import local

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("shard",))
        out = {}
        for name, switched in (("ref", False), ("switched", True)):
            policy = tiny_policy(2, lora)
            batches = [micro_batch(policy, s) for s in range(2)]
            shard_policy(policy, mesh, reshard_after_forward=True, mixed_precision=False)
            learner = Learner(policy, LearnerConfig(lr=1e-2))
            switch = TagSwitch(learner, "always", counts_switches=rank == 0)
            metrics, counted, formula = [], [], []
            for s in range(2):
                mine = batches[s]
                for i, slots in enumerate(UNITS):
                    if i == 1 and switched:  # every rank runs the same generation (FSDP gathers)
                        with switch.helper():
                            assert all(p.grad is None for p in learner.params)
                            helper_generate(policy, learner)
                        counted.append(switch.take())
                        n = sum(local(p).numel() for p in learner.params)
                        formula.append(switch_bytes(
                            trainable=n, master_bytes=4, optimizer_elements=2 * n if s else 0, grad_sum_bytes=8,
                            full_ft=lora == 0, sharded=True, optimizer_steps=len(learner.params) if s else 0))
                    learner.accumulate(mine, slots, SPEC, total_samples=4, total_steps=2,
                                       rows=slice(2 * rank, 2 * rank + 2))
                metrics.append(learner.optimizer_step(version=s + 1))
            opt = [{k: local(v).clone() for k, v in learner.optimizer.state[p].items()} for p in learner.params]
            out[name] = (full_state_dict(policy.module), opt, metrics, counted, formula)
        torch.save(out, f"{tmp}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.slow  # two spawned ranks (~20 s on 2 busy cores)
@LORA
def test_a_gang_rank_restores_its_shards_bit_exactly(tmp_path, lora):
    import torch.multiprocessing as mp

    mp.spawn(_gang_worker, args=(str(tmp_path), lora), nprocs=2, join=True)
    for rank in range(2):
        out = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        ref, switched = out["ref"], out["switched"]
        assert same(switched[:3] + (None,), ref[:3] + (None,))
        counted, formula = switched[3], switched[4]
        assert [c["tag/offload_bytes"] for c in counted] == [2 * f for f in formula] and formula[1] > formula[0] > 0
        assert all(c["tag/reload_bytes"] == 0 for c in counted)  # the masters stay on a gang
        assert [c["tag/switches"] for c in counted] == [int(rank == 0)] * 2


@pytest.mark.slow  # a 2-step Ray run (~2 min on 2 busy cores)
def test_run_counts_the_bytes_the_simulator_charges(ray_cluster, tmp_path):
    """benchmarks/tag_switch_costs.py's run: one trainer, no rollout pool, tag_offload=always,
    whole-trajectory Generate units. The tag/* the run counted equal what the simulator's
    accounting (sim/tag_switch.SwitchLedger on the same config's schedule, switch_bytes of the
    policy's sizes) charges: 2 round trips a step, one of them offloading."""
    import importlib.util
    from pathlib import Path

    from digenrl.config.schema import load_config

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tag_switch_costs.py"
    spec = importlib.util.spec_from_file_location("tag_switch_costs", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = load_config(None, [f"run.run_dir={tmp_path}/run", *bench.overrides(4, [])])
    run, _ = bench.counted(cfg)
    sim = bench.simulated(cfg)
    assert run["tag/offloads"] == sim.offloads == cfg.train.steps
    assert run["tag/switches"] == sim.switches == 2 * cfg.train.steps
    assert run["tag/offload_bytes"] == sim.offload_bytes > 0
    assert run["tag/reload_bytes"] == sim.reload_bytes
