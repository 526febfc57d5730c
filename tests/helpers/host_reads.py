"""Counts reads of a tensor's value back to the host made while a learner pass runs."""

from __future__ import annotations

import torch

READS = ("__bool__", "__float__", "__int__", "item", "tolist", "numpy")


def count_host_reads_in_passes(monkeypatch) -> tuple[list[str], list[bool]]:
    """Patch torch.Tensor's host reads (bool, float, int, item, tolist, numpy) and
    Learner._backward_pairs so that every read made inside a pass is appended, by name, to the
    returned list (on a GPU each stalls the stream). Also returned: the one-element flag that
    says a pass is running (a test sets it to show the counter counts)."""
    from digenrl.learner import learner as learner_mod

    reads, inside = [], [False]
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *a, _original=original, _name=name, **k):
            if inside[0]:
                reads.append(_name)
            return _original(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counting)
    passes = learner_mod.Learner._backward_pairs

    def in_pass(self, *a, **k):
        inside[0] = True
        try:
            return passes(self, *a, **k)
        finally:
            inside[0] = False
    monkeypatch.setattr(learner_mod.Learner, "_backward_pairs", in_pass)
    return reads, inside
