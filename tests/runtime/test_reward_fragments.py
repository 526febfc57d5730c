"""GAP's generation fragments: a micro-batch scored fragment by fragment, in any order, is
assembled into the rewards and the advantages of scoring it whole (runtime.backend)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from digenrl.math import combine_rewards, group_advantages
from digenrl.runtime.backend import assemble_rewards
from digenrl.runtime.results import Rewarded


@pytest.mark.parametrize("aggregate", ["sum", "gdpo"])
def test_fragments_assemble_to_the_whole_in_any_order(aggregate):
    g = torch.Generator().manual_seed(0)
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])  # two prompt groups of 4 generations
    scores = {"a": torch.rand(8, generator=g), "b": 10 * torch.rand(8, generator=g)}
    cfg = SimpleNamespace(weights={"a": 1.0, "b": 0.5}, aggregate=aggregate)
    whole = combine_rewards(scores, cfg.weights, aggregate=aggregate, group_ids=group_ids)
    cuts = [(0, 3), (3, 5), (5, 8)]  # fragments straddle the groups
    frags = {c: Rewarded(start=float(i), end=float(i) + 1, group_ids=group_ids[c[0]:c[1]],
                         parts={k: v[c[0]:c[1]] for k, v in scores.items()},
                         rewards=combine_rewards({k: v[c[0]:c[1]] for k, v in scores.items()}, cfg.weights,
                                                 aggregate=aggregate, group_ids=group_ids[c[0]:c[1]]))
             for i, c in enumerate(cuts)}
    for order in itertools.permutations(cuts):  # the order the fragments finished in
        got = assemble_rewards([frags[c] for c in sorted(order)], cfg)
        assert torch.allclose(got.rewards, whole, atol=1e-6)
        assert torch.equal(got.group_ids, group_ids)
        adv = group_advantages(got.rewards, got.group_ids, std="group", clip=5.0)
        assert torch.allclose(adv, group_advantages(whole, group_ids, std="group", clip=5.0), atol=1e-5)
    if aggregate == "gdpo":  # a fragment alone standardises over part of a group: not the whole's
        assert not torch.allclose(torch.cat([frags[c].rewards for c in cuts]), whole, atol=1e-3)
