"""Checkpoints without pickle on disk: safetensors for tensors, JSON for the rest.

Two layouts of one step directory; every reader here accepts both:

    <run_dir>/checkpoints/step_000010/          unsharded (the local Trainer writes it)
        policy.safetensors      trainable weights (adapters only under LoRA)
        optimizer.safetensors   optimizer state tensors; param_groups in the metadata
        ema.safetensors         EMA weights, when EMA is on
        old_policy.safetensors  DiffusionNFT's old-policy weights, when train.nft_decay > 0
        state.json              step, policy version, data cursor, config

    <run_dir>/checkpoints/step_000010/          sharded (the ranks of one FSDP gang write it)
        dcp/shard-0000<r>-model-00001-of-00001.safetensors
                                rank r's shards of policy.*, optimizer.*, ema.* and old.* tensors
        dcp/optimizer.json      AdamW param_groups (lr, betas, ...), keyed by parameter name
        state.json

Sharded checkpoints go through `torch.distributed.checkpoint` (DCP) with its
safetensors storage (`HuggingFaceStorageWriter(save_distributed=True)`): each rank writes
its local shards with their global offsets in the safetensors header, and the reader
rebuilds DCP's metadata from those headers, so a load into any gang size, or into a plain
unsharded module with no process group, reads exactly the slices it needs (resharding).
What is and is not pickled:
  - on disk: nothing. DCP's default `FileSystemWriter` would `pickle.dump` its `.metadata`
    (read back with a bare `pickle.load`) and `torch.save` every tensor; we use neither.
    Non-tensor optimizer state (param_groups) goes to JSON, because the safetensors writer
    would put DCP's pickled byte items in front of the safetensors blob.
  - in memory: DCP's save/load planning exchanges plans between the gang's ranks with
    `all_gather_object`/`scatter_object`, which pickle over the process group.

A checkpoint is written to a temporary folder and renamed into place, so a crash while
saving never leaves a half-written "latest" checkpoint. Its `manifest.json` records every
file's size and xxh3-128 hash (state.json, written last, marks the folder complete). The
hashes are computed while the files are written, each rank hashing its own shards, and
merged by the committing rank (`digenrl.io.integrity`: what is hashed, how, and why xxh3);
`--resume` picks the newest checkpoint that still matches its manifest, checked one thread
per file, so a checkpoint truncated or damaged later (a full disk, a bad copy between
machines) is refused with the reason, and the one before it is used.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
import torch.distributed as dist
from safetensors.torch import load_file

# CheckpointError lives with the checks; callers catch it as checkpoint.CheckpointError
from digenrl.io.integrity import CheckpointError, Digests, check_written, manifest, verify

if TYPE_CHECKING:
    from digenrl.learner.ema import EMA
    from digenrl.learner.old_policy import OldPolicy

DCP_DIR = "dcp"
_GROUPS_FILE = "optimizer.json"
MANIFEST = "manifest.json"

log = logging.getLogger(__name__)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for pid, state in sd["state"].items():
        for k, v in state.items():
            tensors[f"{pid}.{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().cpu().contiguous()
    return tensors, {"param_groups": json.dumps(sd["param_groups"])}


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        groups = json.loads(f.metadata()["param_groups"])
    state: dict[int, dict[str, Any]] = {}
    for key, t in load_file(str(path)).items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = t
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    policy_state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    ema_state: Optional[dict[str, torch.Tensor]],
    state: dict[str, Any],
    keep: int,
    old_state: Optional[dict[str, torch.Tensor]] = None,
) -> Path:
    """Write the unsharded layout (one process holds everything)."""
    tmp, final = _step_dirs(run_dir, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    digests = Digests(tmp)  # each file hashed as it is written
    digests.save_safetensors(policy_state, tmp / "policy.safetensors")
    tensors, meta = optimizer_tensors(optimizer)
    digests.save_safetensors(tensors, tmp / "optimizer.safetensors", metadata=meta)
    if ema_state is not None:
        digests.save_safetensors(ema_state, tmp / "ema.safetensors")
    if old_state is not None:
        digests.save_safetensors(old_state, tmp / "old_policy.safetensors")
    _commit(run_dir, tmp, final, state, keep, digests.files)
    return final


def save_sharded_checkpoint(
    run_dir: Path,
    step: int,
    *,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: Optional["EMA"],
    state: dict[str, Any],
    keep: int,
    group: Optional[dist.ProcessGroup] = None,
    old: Optional["OldPolicy"] = None,
) -> Path:
    """Write the sharded layout: a collective, every rank of `group` (one gang) calls it.

    Rank 0 of the group prepares the temporary folder, merges every rank's hashes of its
    own files into the manifest, writes state.json and renames the folder into place; the
    barriers keep the other ranks from writing before the folder exists and from returning
    before the checkpoint is complete (the gather of the hashes is a barrier too).
    """
    tmp, final = _step_dirs(run_dir, step)
    lead = _alone(group) or dist.get_rank(group) == 0
    if lead:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(group)
    digests = Digests(tmp)
    save_sharded(tmp, module, optimizer, ema, group, digests=digests, old=old)
    files = _gather_files(digests.files, group)
    if lead:
        _commit(run_dir, tmp, final, state, keep, files)
    _barrier(group)
    return final


def save_sharded(
    step_dir: Path,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: Optional["EMA"],
    group: Optional[dist.ProcessGroup] = None,
    digests: Optional[Digests] = None,
    old: Optional["OldPolicy"] = None,
) -> None:
    """Write `step_dir/dcp/`: trainable weights, AdamW state and EMA, each rank its shards.

    A collective over `group` (the gang's process group; None = the default group, or
    this process alone when there is no default group: the local Trainer). The
    module may be FSDP2-sharded (DTensor parameters) or plain; tensors are keyed by
    parameter name, so any gang size, or an unsharded module, can load them.
    `digests` (rooted at `step_dir`) receives the size and hash of the files this rank wrote.
    """
    from torch.distributed.checkpoint import save as dcp_save

    from digenrl.io.dcp_hashing import HashingStorageWriter

    if not optimizer.state:
        # DCP's get_optimizer_state_dict would initialise the state with a zero-lr step,
        # leaving this live optimizer at step 1 with zero moments: not the fresh one it is
        raise ValueError("save_sharded before the first optimizer step: there is no optimizer state to save")
    out = Path(step_dir) / DCP_DIR
    out.mkdir(parents=True, exist_ok=True)
    digests = digests if digests is not None else Digests(step_dir)
    tensors, groups = _dcp_state(module, optimizer, ema, old)
    with _quiet_if_alone(group):
        dcp_save(tensors, storage_writer=HashingStorageWriter(str(out), digests, save_distributed=True),
                 process_group=group, no_dist=_alone(group))
    if _alone(group) or dist.get_rank(group) == 0:
        digests.write_bytes(out / _GROUPS_FILE, json.dumps(groups, indent=1).encode())


def load_sharded(
    step_dir: Path,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: Optional["EMA"],
    group: Optional[dist.ProcessGroup] = None,
    old: Optional["OldPolicy"] = None,
) -> None:
    """Read `step_dir/dcp/` into `module`, `optimizer` and `ema` in place, resharding.

    With a process group: a collective over it, each rank reads the slices of its own
    shards. With group=None and no default process group (the local Trainer): one process
    reads the whole tensors into a plain module.
    """
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    src = Path(step_dir) / DCP_DIR
    tensors, live_groups = _dcp_state(module, optimizer, ema, old)
    with _quiet_if_alone(group):  # DCP raises on a name the checkpoint lacks: every tensor below was read
        dcp_load(tensors, storage_reader=HuggingFaceStorageReader(str(src)), process_group=group,
                 no_dist=_alone(group))
    saved_groups = json.loads((src / _GROUPS_FILE).read_text())
    # strict=False: under LoRA the frozen base is not in `tensors` (it is rebuilt, not loaded)
    set_model_state_dict(module, tensors["policy"], options=_options(strict=False))
    set_optimizer_state_dict(module, optimizer, {"state": tensors["optimizer"],
                                                 "param_groups": _restore_groups(live_groups, saved_groups)},
                             options=_options())
    # EMA and old-policy shadows were read in place (they are the tensors `_dcp_state` handed to DCP)


def load_checkpoint(
    step_dir: Path,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: Optional["EMA"],
    group: Optional[dist.ProcessGroup] = None,
    old: Optional["OldPolicy"] = None,
) -> dict[str, Any]:
    """Load either layout into module/optimizer/ema (and DiffusionNFT's old policy) in place;
    returns state.json.

    A sharded checkpoint (step_dir/dcp/) loads into any gang size or an unsharded module;
    the unsharded layout loads into an unsharded module only.
    """
    step_dir = Path(step_dir)
    state = json.loads((step_dir / "state.json").read_text())
    if is_sharded(step_dir):
        load_sharded(step_dir, module, optimizer, ema, group, old=old)
        return state
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in module.parameters()):
        raise ValueError(f"{step_dir} holds an unsharded checkpoint (no {DCP_DIR}/): it loads into an unsharded "
                         f"module only (run.mode=local, or runtime.trainer.shard=none)")
    from digenrl.models.lora import load_trainable_state_dict

    load_trainable_state_dict(module, load_file(str(step_dir / "policy.safetensors")))
    load_optimizer_tensors(optimizer, step_dir / "optimizer.safetensors")
    if ema is not None:
        ema.load_state_dict(load_file(str(step_dir / "ema.safetensors")))
    if old is not None:
        old.load_state_dict(load_file(str(step_dir / "old_policy.safetensors")))
    return state


def load_weights(step_dir: Path, module: torch.nn.Module, *, ema: bool = False) -> None:
    """Only the trainable weights of a checkpoint (either layout) or of final/, into a plain
    unsharded `module` in place: no optimizer, no process group (`digenrl sample`/`eval`).

    `ema`: the EMA weights instead of the policy's. `module` must have the run's LoRA
    adapters (build_policy of the run's model config) when the run trained adapters.
    """
    from digenrl.models.lora import load_trainable_state_dict

    step_dir = Path(step_dir)
    what = "ema" if ema else "policy"
    if not is_sharded(step_dir):
        path = step_dir / f"{what}.safetensors"
        if not path.exists():
            raise FileNotFoundError(f"{step_dir} has no {path.name}" + (" (was train.ema_decay 0?)" if ema else ""))
        load_trainable_state_dict(module, load_file(str(path)))
        return
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint import load as dcp_load

    # the tensors DCP saved under `what` (_dcp_state): the module's non-frozen parameters,
    # plus its buffers for the policy; DCP reads only the names asked for
    live = {n: p for n, p in module.named_parameters() if p.requires_grad}
    if what == "policy":
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        live = get_model_state_dict(module, options=_options())
    tree = {what: {n: t.detach().clone() for n, t in live.items()}}
    with _quiet_if_alone(None):
        dcp_load(tree, storage_reader=HuggingFaceStorageReader(str(step_dir / DCP_DIR)), no_dist=True)
    load_trainable_state_dict(module, tree[what])


def is_sharded(step_dir: Path) -> bool:
    return (Path(step_dir) / DCP_DIR).is_dir()


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / "state.json").exists())


def latest_checkpoint(run_dir: Path, *, verify: bool = True) -> Optional[Path]:
    """The newest checkpoint; with `verify`, the newest that matches its manifest: a damaged
    one is skipped with a warning that names the problem and the checkpoint used instead."""
    found = list_checkpoints(run_dir)
    if not verify:
        return found[-1] if found else None
    for step_dir in reversed(found):
        try:
            verify_checkpoint(step_dir)
            return step_dir
        except CheckpointError as e:
            older = [p.name for p in found if p < step_dir]
            log.warning("checkpoint refused: %s; %s", e,
                        f"trying {older[-1]}" if older else "no older checkpoint: starting from step 0")
    return None


# -- internals ----------------------------------------------------------------------
def _step_dirs(run_dir: Path, step: int) -> tuple[Path, Path]:
    root = Path(run_dir) / "checkpoints"
    return root / f".tmp_step_{step:06d}", root / f"step_{step:06d}"


def _files(step_dir: Path) -> list[Path]:
    """Every file of a checkpoint folder but its manifest and state.json, sorted."""
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name not in (MANIFEST, "state.json"))


def verify_checkpoint(step_dir: Path, threads: Optional[int] = None) -> None:
    """Raise CheckpointError naming what is wrong when `step_dir` does not match its manifest:
    state.json missing or not JSON, a file missing, of another size, or with another hash
    (xxh3-128; sha256 in a manifest written before format 2). Files are hashed in parallel,
    at most `threads` at once (default: ThreadPoolExecutor's). A folder written before
    manifests existed passes with a warning (nothing to check)."""
    step_dir = Path(step_dir)
    try:
        json.loads((step_dir / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{step_dir}: state.json is missing or unreadable ({e})") from None
    if not (step_dir / MANIFEST).exists():
        log.warning("%s has no %s (written before checkpoints were checksummed): not verified", step_dir, MANIFEST)
        return
    try:
        tree = json.loads((step_dir / MANIFEST).read_text())
        tree["files"].items()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{step_dir}: {MANIFEST} is unreadable ({e!r})") from None
    verify(step_dir, tree, threads)


def _gather_files(files: dict[str, dict[str, Any]], group: Optional[dist.ProcessGroup]) -> dict[str, dict[str, Any]]:
    """Every rank's {file: size and hash} of the files it wrote, merged (a collective)."""
    if _alone(group):
        return files
    parts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, files, group=group)
    merged: dict[str, dict[str, Any]] = {}
    for part in parts:
        if twice := set(merged) & set(part):
            raise RuntimeError(f"two ranks wrote {sorted(twice)}")
        merged.update(part)
    return merged


def _commit(run_dir: Path, tmp: Path, final: Path, state: dict[str, Any], keep: int,
            files: dict[str, dict[str, Any]]) -> None:
    """manifest.json (size and hash of every file, as the writers hashed it; a stat per file
    checks that every file was hashed and kept its size), state.json last, then rename into
    place and drop all but the newest `keep`."""
    check_written(tmp, files, _files(tmp))
    (tmp / MANIFEST).write_text(json.dumps(manifest(files), indent=1))
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _alone(group: Optional[dist.ProcessGroup]) -> bool:
    """No process group to talk to: DCP runs in this process only (no_dist)."""
    return group is None and not (dist.is_available() and dist.is_initialized())


def _barrier(group: Optional[dist.ProcessGroup]) -> None:
    if not _alone(group):
        dist.barrier(group=group)


@contextlib.contextmanager
def _quiet_if_alone(group: Optional[dist.ProcessGroup]) -> Iterator[None]:
    """Silence DCP's "assuming the intent is to load in a single process": that is the intent."""
    with warnings.catch_warnings():
        if _alone(group):
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _options(strict: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # frozen base weights (LoRA) are rebuilt from the model config, not checkpointed
    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _dcp_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
               ema: Optional["EMA"], old: Optional["OldPolicy"] = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """DCP's tensor tree and the JSON-able param_groups, both keyed by parameter name.

    tree: {"policy": {name: W}, "optimizer": {name: {"step", "exp_avg", "exp_avg_sq"}},
    "ema": {name: shadow}, "old": {name: shadow}}; W, exp_avg, exp_avg_sq and shadow are DTensors on a sharded
    module (DCP saves local shards, loads any layout), `step` is a replicated 0-d tensor.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    optim = get_optimizer_state_dict(module, optimizer, options=_options())
    tree: dict[str, Any] = {"policy": get_model_state_dict(module, options=_options()), "optimizer": optim["state"]}
    for name, slots in optim["state"].items():
        for slot, value in slots.items():
            if not torch.is_tensor(value):  # safetensors holds tensors only; a scalar would be pickled
                raise TypeError(f"optimizer state {name}.{slot} is a {type(value).__name__}, not a tensor")
    if ema is not None:
        tree["ema"] = ema.shadow  # the live shadows: a load fills them in place
    if old is not None:
        tree["old"] = old.shadow  # DiffusionNFT's old policy, the same way
    return tree, optim["param_groups"]


def _restore_groups(live: list[dict[str, Any]], saved: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved hyperparameters on the live groups (matched by their parameter names)."""
    if [sorted(g["params"]) for g in live] != [sorted(g["params"]) for g in saved]:
        raise ValueError("the checkpoint's optimizer groups name other parameters than this optimizer's")

    def value(live_value: Any, saved_value: Any) -> Any:  # JSON turned tuples (betas) into lists
        return tuple(saved_value) if isinstance(live_value, tuple) else saved_value

    return [{**g, **{k: value(g.get(k), v) for k, v in s.items() if k != "params"}} for g, s in zip(live, saved)]
