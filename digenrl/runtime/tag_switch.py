"""A trainer's TAG switch: Actor -> helper (generation) -> Actor, real and counted.

Under TAG a trainer generates Generate units with its own module between its Train units
(TrainerRank.generate). The authors' rule (verl-omni issue 321): the helper never commits
an optimizer step and never disturbs an uncommitted gradient; where gradients have
accumulated, the model, optimizer and gradient state are offloaded and restored losslessly;
every switch is counted. A trainer enters the helper at its first Generate and leaves it
before the next unit that is not one (`generating()`, `leave()`): consecutive Generates, the
segments of one trajectory at runtime.tag_segment below its length or several micro-batches,
share one round trip, as digenrl.sim.tag_switch.SwitchLedger charges. `helper()` is one whole
round trip around one generation:

    enter   snapshot module train/eval modes and requires_grad; when `must_offload` says so
            (runtime.trainer.tag_offload, digenrl/sim/tag_switch.py), copy to host buffers and
            drop the device tensors of: AdamW state, p.grad, GradSum's float64 sums, and in an
            unsharded full fine-tune the trainable weights (the helper then generates with a
            generation copy loaded from the host copy). An FSDP2 gang rank moves its shards
            (DTensors rebuilt on the way back); its masters stay, as its forwards gather them
    ...     generation (no backward, no optimizer step)
    leave   copy everything back from the host buffers (bit for bit), restore modes and
            requires_grad

Pure torch over a Learner: no Ray. The bytes it moves equal digenrl.sim.tag_switch.switch_bytes
of the same sizes (tests/runtime/test_tag_switch.py), which is what the simulator charges.
On a CPU trainer "host" and "device" are the same memory: the offload still makes separate
copies and drops the originals, so the bytes really move and the restore is really tested.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Optional

import torch

from digenrl.math.grad_sum import is_dtensor, local
from digenrl.models.lora import has_lora
from digenrl.sim.tag_switch import must_offload

# per RL step: round trips (a gang counts one), those that offloaded (per rank), bytes out + back,
# generation weights loaded (full fine-tune), seconds offloading + restoring (summed over ranks)
METRICS = ("tag/switches", "tag/offloads", "tag/offload_bytes", "tag/reload_bytes", "tag/switch_s")


class _Held:
    """A host copy of one tensor (of this rank's shard, for an FSDP2 DTensor) and what rebuilds it."""

    def __init__(self, t: torch.Tensor):
        shard = local(t.detach())
        self.device = shard.device
        self.spec = (t.device_mesh, t.placements, t.shape, t.stride()) if is_dtensor(t) else None
        # pinned when the shard is on a GPU (a fast copy back); on a CPU a separate copy all the same
        self.host = torch.empty(shard.shape, dtype=shard.dtype, device="cpu", pin_memory=shard.is_cuda)
        self.host.copy_(shard)
        self.nbytes = self.host.numel() * self.host.element_size()

    def back(self) -> torch.Tensor:
        """A fresh device tensor equal to the original bit for bit (a DTensor again if it was one)."""
        shard = torch.empty(self.host.shape, dtype=self.host.dtype, device=self.device)
        shard.copy_(self.host)
        if self.spec is None:
            return shard
        from torch.distributed.tensor import DTensor

        mesh, placements, shape, stride = self.spec
        return DTensor.from_local(shard, mesh, placements, shape=shape, stride=stride)


class _Offloaded:
    """What one switch moved: the host copies, and where each goes back."""

    def __init__(self) -> None:
        self.optimizer: list[tuple[dict, str, _Held]] = []  # (AdamW state of a parameter, key, copy)
        self.grads: list[tuple[torch.nn.Parameter, _Held]] = []
        self.sums: list[tuple[int, _Held]] = []
        self.masters: list[tuple[torch.nn.Parameter, _Held]] = []
        self.bytes = 0  # one way
        self.reload = 0

    def hold(self, t: torch.Tensor) -> _Held:
        held = _Held(t)
        self.bytes += held.nbytes
        return held


class TagSwitch:
    """Counts and, when needed, offloads around a trainer's Generate units (see module doc).

    `policy`: runtime.trainer.tag_offload (auto | always | never). `counts_switches`: this rank
    reports the switch count (rank 0 of a gang; every rank reports its own bytes and seconds).
    `clock`: seconds, for tag/switch_s (injectable for tests)."""

    def __init__(self, learner, policy: str = "auto", counts_switches: bool = True,
                 clock: Callable[[], float] = time.perf_counter):
        self.learner = learner
        self.policy = policy
        self.counts_switches = counts_switches
        self.clock = clock
        self.generation_peak: Optional[int] = None  # auto on a GPU: bytes a generation added (last one)
        self.last: Optional[_Offloaded] = None  # the last switch's record (tests read it)
        self._counts = dict.fromkeys(METRICS, 0)
        self._open: Optional[tuple] = None  # in the helper: (modes, requires_grad, what moved)

    @property
    def in_helper(self) -> bool:
        return self._open is not None

    # -- what is on the trainer -----------------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        return self.learner.policy.module

    def accumulated(self) -> bool:
        """Has this step's training left anything uncommitted (gradients, sums, loss weight)?"""
        learner = self.learner
        return (learner.accumulated()[1] > 0 or any(learner.grads.touched())
                or any(p.grad is not None for p in learner.params))

    @property
    def full_ft(self) -> bool:
        """The trainable weights are the model's own (no LoRA adapters among them)."""
        return not has_lora(self.module)

    def decide(self) -> bool:
        """Offload at this switch? (digenrl.sim.tag_switch.must_offload with this rank's numbers)"""
        accumulated = self.accumulated()
        device = self.learner.params[0].device
        if self.policy != "auto" or device.type != "cuda":
            return must_offload(self.policy, accumulated=accumulated, on_gpu=device.type == "cuda")
        if self.generation_peak is None:  # no generation measured yet: make room, and measure it
            return accumulated
        return must_offload("auto", accumulated=accumulated, on_gpu=True,
                            resident_bytes=torch.cuda.memory_allocated(device),
                            generation_bytes=self.generation_peak,
                            device_bytes=torch.cuda.get_device_properties(device).total_memory)

    # -- the switch ---------------------------------------------------------------------------
    def enter(self) -> None:
        """Actor -> helper, unless already there: snapshot modes and requires_grad, offload when
        `decide` says so."""
        if self._open is not None:
            return
        modes = [(m, m.training) for m in self.module.modules()]
        needs = [(p, p.requires_grad) for p in self.module.parameters()]
        t0 = self.clock()
        moved = self.offload() if self.decide() else None
        self._counts["tag/switch_s"] += self.clock() - t0
        self._open = (modes, needs, moved)

    def leave(self) -> None:
        """Helper -> Actor, if in the helper: everything back bit for bit, the round trip counted.
        Called before every unit a trainer runs that is not a Generate."""
        if self._open is None:
            return
        modes, needs, moved = self._open
        self._open = None
        t1 = self.clock()
        if moved is not None:
            self.restore(moved)
        for m, training in modes:
            m.train(training)
        for p, requires_grad in needs:
            p.requires_grad_(requires_grad)
        self.last = moved
        c = self._counts
        c["tag/switch_s"] += self.clock() - t1
        c["tag/switches"] += int(self.counts_switches)
        c["tag/offloads"] += int(moved is not None)
        c["tag/offload_bytes"] += 2 * moved.bytes if moved is not None else 0  # out and back
        c["tag/reload_bytes"] += moved.reload if moved is not None else 0

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """One Generate in the helper (entered if not yet); the trainer stays there afterwards.
        auto on a GPU measures what the generation adds (resets the CUDA peak counter around it)."""
        self.enter()
        device = self.learner.params[0].device
        measure = device.type == "cuda" and self.policy == "auto"
        if measure:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        try:
            yield
        finally:
            if measure:
                self.generation_peak = torch.cuda.max_memory_allocated(device) - base

    @contextlib.contextmanager
    def helper(self) -> Iterator[None]:
        """One whole Actor -> helper -> Actor round trip around the generation it wraps."""
        try:
            with self.generating():
                yield
        finally:
            self.leave()

    @property
    def masters_move(self) -> bool:
        """A full fine-tune's trainable weights go to the host, and the helper generates with a
        copy loaded back. Not in a sharded gang: its generation all-gathers from those shards."""
        return self.full_ft and not self.learner.sharded

    def offload(self) -> _Offloaded:
        """Move the uncommitted training state to host buffers; drop the device tensors."""
        learner, out = self.learner, _Offloaded()
        with torch.no_grad():
            for p in learner.params:
                state = learner.optimizer.state.get(p)
                for key, value in (state or {}).items():
                    if torch.is_tensor(value) and value.device == p.device:
                        out.optimizer.append((state, key, out.hold(value)))
            for state, key, _ in out.optimizer:
                state[key] = None  # (the device tensor's last reference)
            for p in learner.params:
                if p.grad is not None:
                    out.grads.append((p, out.hold(p.grad)))
                    p.grad = None
            sums = learner.grads.sums
            if learner.grads.folding:
                for i, s in enumerate(sums):
                    if s is not None:
                        out.sums.append((i, out.hold(s)))
                        sums[i] = None
            if self.masters_move:
                for p in learner.params:
                    held = out.hold(p.data)
                    out.masters.append((p, held))
                    p.data = held.back()  # the generation copy, loaded from the host copy
                    out.reload += held.nbytes
        return out

    def restore(self, moved: _Offloaded) -> None:
        """Everything `offload` moved, back on the device bit for bit (fresh tensors)."""
        learner = self.learner
        with torch.no_grad():
            for p, held in moved.masters:
                p.data = held.back()  # (drops the generation copy)
            for i, held in moved.sums:
                learner.grads.sums[i] = held.back()
            for p, held in moved.grads:
                p.grad = held.back()
            for state, key, held in moved.optimizer:
                state[key] = held.back()

    def take(self) -> dict:
        """tag/* since the last take (read at the optimizer step, like comm/*), then zero."""
        out, self._counts = self._counts, dict.fromkeys(METRICS, 0)
        return out
