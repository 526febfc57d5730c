"""Tiny DiT weight files: one safetensors file, its TinyDiTConfig in the metadata.

    save_tiny_dit(model, path)      write (format "digenrl.tiny_dit")
    load_tiny_dit(path)             read back the same module, bit for bit
    load_base()                     the toy world's base generator: the shipped asset,
                                    else a copy rebuilt by `digenrl pretrain-toy`

Pretraining itself is the toy world's business (`digenrl/toy/pretrain.py`); the model
package only reads and writes the file, so `models` never imports `toy`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from safetensors.torch import load_file, save_file

from digenrl.models.tiny_dit import TinyDiT, TinyDiTConfig

FORMAT = "digenrl.tiny_dit"
ASSET = Path(__file__).resolve().parent.parent / "assets" / "toy_base.safetensors"


def save_tiny_dit(model: TinyDiT, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"config": json.dumps(model.config.__dict__), "format": FORMAT}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path), metadata=meta)


def check_tiny_dit_file(path: Path) -> dict:
    """The config fields of a tiny DiT file (reads the header only); ValueError if it is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except SafetensorError as e:  # a file, but not safetensors (a missing file raises FileNotFoundError)
        raise ValueError(f"{path} is not a safetensors file: {e}") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a digenrl tiny-dit checkpoint (metadata format={meta.get('format')!r})")
    fields = json.loads(meta["config"])
    fields.setdefault("pos_embed", "learned")  # files written before sin-cos positions existed
    return fields


def load_tiny_dit(path: Path) -> TinyDiT:
    model = TinyDiT(TinyDiTConfig(**check_tiny_dit_file(path)))
    model.load_state_dict(load_file(str(path)))
    return model


def empty_tiny_dit(path: Path) -> TinyDiT:
    """The tiny DiT of `path`'s config, its parameters on the meta device (digenrl.models.empty)."""
    from digenrl.models.empty import params_on_meta

    with params_on_meta():
        return TinyDiT(TinyDiTConfig(**check_tiny_dit_file(path)))


def cache_path() -> Path:
    """Where a rebuilt base may live when the package folder is read-only ($DIGENRL_CACHE)."""
    root = Path(os.environ.get("DIGENRL_CACHE", Path.home() / ".cache" / "digenrl"))
    return root / "toy_base.safetensors"


def find_base() -> Optional[Path]:
    """The base file that `load_base` would read, or None."""
    for path in (ASSET, cache_path()):
        if path.exists():
            return path
    return None


def missing_base_message() -> str:
    return (f"the toy base generator is missing (looked for {ASSET} and {cache_path()}); rebuild it with "
            f"`digenrl pretrain-toy` (~40 min on one core), or `digenrl pretrain-toy --out {cache_path()}` "
            f"when the package folder is read-only")


def load_base() -> TinyDiT:
    """The shipped toy base (or its rebuilt copy in the cache)."""
    path = find_base()
    if path is None:
        raise FileNotFoundError(missing_base_message())
    return load_tiny_dit(path)
