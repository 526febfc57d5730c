"""Modules built without their weights: parameters on the meta device, read later by slice.

A trainer gang never holds a whole model (runtime/sharded_load.py): it builds the module's
structure here, shards it, and each rank then reads only its own rows of every weight from
the checkpoint's safetensors files.

    params_on_meta()        construct a module: parameters on meta, buffers real (a buffer is
                            computed in __init__, e.g. rotary tables, and rarely in a checkpoint)
    WeightFiles(files)      name -> the safetensors file that holds it; read(name, index)
                            reads one slice of one tensor (the bytes of that slice only)
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator, Sequence

import torch


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Every parameter registered inside this block moves to the meta device as it is
    registered; buffers stay where they were made. A layer's own init (nn.Linear's
    reset_parameters) then runs on meta tensors: no weight bytes are ever allocated."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def is_empty(module: torch.nn.Module) -> bool:
    """Whether `module` holds parameters on the meta device (built by params_on_meta)."""
    return any(p.is_meta for p in module.parameters())


def move(module: torch.nn.Module, device=None, dtype=None) -> torch.nn.Module:
    """nn.Module.to(device, dtype) that also takes a module with meta parameters: those only
    change dtype (they stay on meta until materialised), its buffers and real tensors move."""
    if not is_empty(module):
        return torch.nn.Module.to(module, device=device, dtype=dtype)

    def convert(t: torch.Tensor) -> torch.Tensor:
        cast = dtype if dtype is not None and t.is_floating_point() else None
        return t.to(dtype=cast) if t.is_meta else t.to(device=device, dtype=cast)

    return module._apply(convert)


class WeightFiles:
    """Where each tensor of a checkpoint lives, over one or more safetensors files (a diffusers
    folder's shards, or a single file). Opening a file reads only its header."""

    def __init__(self, files: Sequence[Path]):
        from safetensors import safe_open

        if not files:
            raise FileNotFoundError("no safetensors file to read weights from")
        self.files = [Path(f) for f in files]
        self.where: dict[str, Path] = {}
        for f in self.files:
            with safe_open(str(f), framework="pt") as h:
                for key in h.keys():
                    self.where[key] = f

    @classmethod
    def in_folder(cls, folder: Path) -> "WeightFiles":
        """A diffusers model folder (transformer/): its index's shards, or every *.safetensors."""
        folder = Path(folder)
        index = sorted(folder.glob("*.safetensors.index.json"))
        if index:
            names = sorted(set(json.loads(index[0].read_text())["weight_map"].values()))
            return cls([folder / n for n in names])
        return cls(sorted(folder.glob("*.safetensors")))

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def open(self) -> "_Reader":
        """A reader that keeps its files open (mapped) until closed: open one per FSDP unit, so
        the mapped pages a rank has touched never add up to more than one unit's rows."""
        return _Reader(self)


class _Reader:
    def __init__(self, files: WeightFiles):
        self.files = files
        self.handles: dict[Path, object] = {}

    def read(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        """Rows `index` (one slice per dim) of tensor `name`, as stored (a fresh tensor)."""
        from safetensors import safe_open

        path = self.files.where[name]
        if path not in self.handles:
            self.handles[path] = safe_open(str(path), framework="pt")
        part = self.handles[path].get_slice(name)
        if not part.get_shape():  # a 0-dim tensor: no slicing
            return self.handles[path].get_tensor(name)
        return part[index] if index else part[:]

    def close(self) -> None:
        self.handles.clear()  # safe_open handles unmap when dropped

    def __enter__(self) -> "_Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
