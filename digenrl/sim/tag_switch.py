"""What one TAG switch moves, in bytes, and when it must: numbers only, so the runtime's
counter (digenrl/runtime/tag_switch.py) and the simulator charge the same thing.

A switch is one round trip of a trainer, Actor -> helper (it generates) -> Actor. Under the
authors' rule (verl-omni issue 321) the helper never disturbs an uncommitted gradient: when
gradients have accumulated and the training state plus a generation does not fit the device,
the switch offloads that state to host memory before generating and restores it after, bit
for bit. Each way it moves, per trainer rank (elements of the rank's trainable parameters):

    gradients        p.grad                          trainable x master_bytes
    gradient sums    GradSum float64 running sums    trainable x 8   (train.grad_sum float64;
                                                                       float32: the sum is p.grad)
    optimizer state  AdamW exp_avg, exp_avg_sq        optimizer_elements x master_bytes
                     and `step` when it sits on the   + optimizer_steps x 4
                     device (CPU; fused/capturable)
    masters          an unsharded full fine-tune:     trainable x master_bytes
                     the trainable weights go to the
                     host, and the helper generates
                     with a generation copy loaded
                     from there (reload_bytes); a
                     sharded gang's stay (its
                     forwards gather from them)

What stays: the frozen base (LoRA), DiffusionNFT's old policy, EMA shadows, a KL reference.
Nothing accumulated (a switch at a step boundary): nothing moves.
"""

from __future__ import annotations

from digenrl.config.runtime import TAG_OFFLOAD  # runtime.trainer.tag_offload: auto | always | never
from digenrl.sched.units import Generate, OptimizerStep, Train
from digenrl.sim.memory import RESERVED_GIB, USABLE_FRACTION


def switch_bytes(*, trainable: int, master_bytes: int, optimizer_elements: int, grad_sum_bytes: int,
                 full_ft: bool, optimizer_steps: int = 0, sharded: bool = False) -> int:
    """Bytes one offload moves to the host, = the bytes its restore moves back (see module doc).

    trainable           trainable elements on the rank (all of them hold a gradient)
    master_bytes        bytes per element of the trainable weights (and of p.grad, AdamW state)
    optimizer_elements  AdamW exp_avg + exp_avg_sq elements (2 x trainable after the first
                        optimizer step; 0 before it)
    grad_sum_bytes      8: float64 sums beside p.grad; 4: the sum is p.grad itself
    full_ft             the trainable weights are the model's (masters move); LoRA: adapters only
                        and the masters stay (the adapters are the generation weights)
    optimizer_steps     AdamW `step` scalars on the device (float32), one per parameter tensor
                        on CPU or fused/capturable AdamW; 0 where torch keeps them on the host
    sharded             an FSDP gang rank (sizes are its shards): the masters stay, since the
                        helper's forwards all-gather from them
    """
    if grad_sum_bytes not in (4, 8):
        raise ValueError(f"grad_sum_bytes is 8 (float64 sums) or 4 (float32: p.grad), got {grad_sum_bytes}")
    grads = trainable * master_bytes
    sums = trainable * 8 if grad_sum_bytes == 8 else 0
    optimizer = optimizer_elements * master_bytes + 4 * optimizer_steps
    masters = trainable * master_bytes if full_ft and not sharded else 0
    return grads + sums + optimizer + masters


def reload_bytes(*, trainable: int, generation_bytes: int, full_ft: bool, sharded: bool = False) -> int:
    """Bytes of the generation weights loaded for the helper when a full fine-tune's masters
    are offloaded (host -> device once a switch; dropped, not copied back, on the way out)."""
    return trainable * generation_bytes if full_ft and not sharded else 0


def must_offload(policy: str, *, accumulated: bool, on_gpu: bool, resident_bytes: int = 0,
                 generation_bytes: int = 0, device_bytes: int = 0) -> bool:
    """runtime.trainer.tag_offload's decision at a switch. never: no; nothing accumulated: no;
    always: yes; auto: when what the rank holds now (training state) plus a generation's peak
    exceeds the usable device memory, sim/memory.py's rule (USABLE_FRACTION of HBM less
    RESERVED_GIB). A CPU trainer's memory is the host's: auto never offloads there."""
    if policy not in TAG_OFFLOAD:
        raise ValueError(f"runtime.trainer.tag_offload={policy!r} unknown; allowed: {', '.join(TAG_OFFLOAD)}")
    if policy == "never" or not accumulated:
        return False
    if policy == "always":
        return True
    if not on_gpu:
        return False
    usable = USABLE_FRACTION * device_bytes - RESERVED_GIB * 2**30
    return resident_bytes + generation_bytes > usable


class SwitchLedger:
    """Which units carry a TAG switch, and what each moves: the simulator's charge
    (sim/durations.py) and the figure a run's tag/* counters are compared with
    (benchmarks/tag_switch_costs.py), from the units a trainer runs, in order.

    A trainer's first Generate after training enters the helper; its first Train or
    OptimizerStep after generating leaves it, closing one round trip (`switches`, tag/switches).
    A round trip entered while the trainer held a gradient of its current step (a Train since
    its last OptimizerStep) moves `moved(step)` bytes out and the same back (`offload_bytes`,
    tag/offload_bytes: out + back) and loads `reload` bytes of generation weights on the way in
    (`reload_bytes`, tag/reload_bytes); one entered with nothing accumulated moves nothing.
    `moved`: bytes one way, a number or a function of the RL step (a run's first step has no
    AdamW state yet)."""

    def __init__(self, moved=0, reload: int = 0):
        self.moved, self.reload = moved, reload
        self.switches = self.offloads = self.offload_bytes = self.reload_bytes = 0
        self._helper: dict = {}  # trainer generating -> bytes its entry moved out (0: none)
        self._accum: dict = {}  # trainer -> the step whose gradient it holds

    def _bytes(self, step: int) -> int:
        return self.moved(step) if callable(self.moved) else self.moved

    def unit(self, worker_id: str, unit) -> tuple[str, int, int] | None:
        """`unit` starts on trainer `worker_id`: None where it crosses no switch, else (edge,
        bytes moved one way, generation bytes loaded) with edge "in" (a Generate entering the
        helper), "out" (a Train leaving it) or "out_opt" (an OptimizerStep leaving it)."""
        k = type(unit)
        if k is Generate:
            if worker_id in self._helper:
                return None
            step = self._accum.get(worker_id)  # a gradient accumulated this step goes too
            moved = self._bytes(step) if step is not None else 0
            self._helper[worker_id] = moved
            if not moved:
                return "in", 0, 0
            self.offloads += 1
            self.offload_bytes += 2 * moved
            self.reload_bytes += self.reload
            return "in", moved, self.reload
        if k is Train or k is OptimizerStep:
            moved = self._helper.pop(worker_id, None)  # what its entry moved out comes back
            if k is Train:
                self._accum[worker_id] = unit.step
            else:
                self._accum.pop(worker_id, None)
            if moved is None:
                return None
            self.switches += 1
            return ("out" if k is Train else "out_opt"), moved, 0
        return None

    @classmethod
    def of_trace(cls, trace, roles=("trainer", "colocated"), moved=0, reload: int = 0) -> "SwitchLedger":
        """The ledger of a run's trace (a runtime's or the simulator's): each trainer's units in
        the order they started."""
        ledger = cls(moved, reload)
        for s in sorted(trace.spans, key=lambda s: (s.start, s.end)):
            if trace.workers.get(s.worker) in roles and s.unit is not None:
                ledger.unit(s.worker, s.unit)
        return ledger
