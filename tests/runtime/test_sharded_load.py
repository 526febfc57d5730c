"""Sharded loading (runtime/sharded_load.py) == the whole-model path it replaces.

For each rank of a gang of 2, the module built on the meta device, sharded, then filled from
the checkpoint by slice must hold exactly the tensors of the module built whole, broadcast and
sharded (gang_rank.load_sharded's two branches): the same local rows, the same dtypes (fp32
masters for what trains, the frozen base in bf16 under LoRA), the same buffers.

One process plays one rank at a time over torch's fake process group: FSDP2 computes a rank's
shards locally, and the whole path's broadcast (a no-op there) only copies rank 0's values,
which both paths build from the same file and the same LoRA seed anyway. The runtime's own
2-rank gangs (tests/runtime/test_gangs.py) load this way over gloo.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from digenrl.models import build_policy
from digenrl.models.empty import is_empty
from digenrl.models.tiny_dit import TinyDiT, TinyDiTConfig
from digenrl.models.tiny_dit_weights import save_tiny_dit
from digenrl.runtime.gang_rank import load_sharded
from digenrl.runtime.sharded_load import materialise

GANG = 2


def _model(path: Path, name: str = "tiny-dit", lora_rank: int = 0, **extra) -> SimpleNamespace:
    """A ModelConfig's fields as build_policy reads them (fp32: master_config's)."""
    return SimpleNamespace(name=name, path=str(path), dtype="float32", device="cpu", lora_rank=lora_rank,
                           lora_alpha=8.0, lora_targets=(), grad_ckpt=False, **extra)


def _local_state(policy) -> dict[str, torch.Tensor]:
    return {n: (v.to_local() if isinstance(v, DTensor) else v).detach().clone()
            for n, v in policy.module.state_dict().items()}


def _both_paths(model: SimpleNamespace, rank: int) -> tuple[dict, dict]:
    """This rank's state after the whole-model path and after the sharded load."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=GANG)
    try:
        mesh = init_device_mesh("cpu", (GANG,))
        out = []
        for empty in (False, True):
            policy = build_policy(model, progress=False, empty=empty)
            assert is_empty(policy.module) == empty
            load_sharded(policy, mesh, dtype="bfloat16", lora=model.lora_rank > 0)
            assert not is_empty(policy.module)
            out.append(_local_state(policy))
        return out[0], out[1]
    finally:
        dist.destroy_process_group()


def _assert_equal(whole: dict, sharded: dict, lora: bool) -> None:
    assert whole.keys() == sharded.keys()
    for name, value in whole.items():
        assert sharded[name].dtype == value.dtype, name
        assert torch.equal(sharded[name], value), name
    # fp32 masters for what trains; under LoRA the frozen base in the compute dtype
    base = {v.dtype for n, v in whole.items() if "lora_" not in n and "weight" in n}
    assert base == ({torch.bfloat16} if lora else {torch.float32})
    assert {v.dtype for n, v in whole.items() if "lora_" in n} <= {torch.float32}
    if lora:
        assert any("lora_A" in n and v.abs().sum() > 0 for n, v in whole.items())  # drawn, not left empty


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    module = TinyDiT(TinyDiTConfig(image_size=8, dim=32, depth=2, heads=2))
    for p in module.parameters():  # off adaLN-zero's zeros: every row differs
        p.data.add_(0.02 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("tiny") / "model.safetensors"
    save_tiny_dit(module, path)
    return path


@pytest.mark.parametrize("rank", range(GANG))
@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_tiny_dit_sharded_load_equals_whole_load(tiny_file, lora_rank, rank):
    whole, sharded = _both_paths(_model(tiny_file, lora_rank=lora_rank), rank)
    _assert_equal(whole, sharded, lora_rank > 0)


def test_a_rank_reads_only_its_rows(tiny_file):
    """The bytes a rank reads are its share of the checkpoint (rows rounded up), not the model."""
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=GANG)
    try:
        policy = build_policy(_model(tiny_file), progress=False, empty=True)
        from digenrl.learner.sharded import shard_policy

        shard_policy(policy, init_device_mesh("cpu", (GANG,)))
        read = materialise(policy.module, policy.weight_files, "cpu")
        total = tiny_file.stat().st_size
        rows = sum(math.ceil(v.shape[0] / GANG) * v[0].numel() * 4 if v.dim() else 4
                   for v in policy.module.state_dict().values() if isinstance(v, DTensor))
        assert 0 < read <= rows < total
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # ~10 s: building the tiny FLUX folder imports diffusers and transformers
@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_flux_sharded_load_equals_whole_load(tmp_path, lora_rank):
    from tests.models.tiny_diffusers import build_flux

    folder = build_flux(tmp_path / "flux")
    model = _model(folder, "flux", lora_rank, height=16, width=16, frames=0, prompt_cache=None, text_encoders=False,
                   max_sequence_length=0, guidance=0.0, experts="")
    for rank in range(GANG):
        whole, sharded = _both_paths(model, rank)
        _assert_equal(whole, sharded, lora_rank > 0)
