"""On-disk prompt-embedding cache: trainers and rollout workers need no text encoder loaded.

One safetensors file per (namespace, prompt), holding that prompt's `Cond` with batch 1.
The namespace names the model and every encoding option that changes the embedding
(family, model id, max sequence length...), so two models never share an entry.

    root/ab/ab12...ef.safetensors      key = sha256(namespace + NUL + prompt)

Writes go to a temporary file and are renamed into place, so workers sharing a
directory (NFS, a shared disk) never read a half-written entry.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence


from digenrl.models.protocol import Cond


class PromptCache:
    def __init__(self, root: str | os.PathLike, namespace: str):
        if not namespace:
            raise ValueError("prompt cache namespace must be non-empty (it names the model and encoding options)")
        self.root = Path(root)
        self.namespace = namespace

    def key(self, prompt: str) -> str:
        return hashlib.sha256(f"{self.namespace}\0{prompt}".encode("utf-8")).hexdigest()

    def path(self, prompt: str) -> Path:
        k = self.key(prompt)
        return self.root / k[:2] / f"{k}.safetensors"

    def get(self, prompt: str) -> Optional[Cond]:
        """The cached condition of one prompt, batch 1 (CPU tensors), or None."""
        from safetensors.torch import load_file

        p = self.path(prompt)
        if not p.exists():
            return None
        return load_file(str(p))

    def put(self, prompt: str, cond: Cond) -> None:
        """Store one prompt's condition (every tensor batch 1)."""
        from safetensors.torch import save_file

        for name, t in cond.items():
            if t.shape[:1] != (1,):
                raise ValueError(f"prompt cache stores one prompt at a time; {name!r} has shape {tuple(t.shape)}")
        p = self.path(prompt)
        p.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in cond.items()}
        # the prompt goes in the metadata so an entry can be audited without the key's preimage
        meta = {"namespace": self.namespace, "prompt": prompt}
        fd, tmp = tempfile.mkstemp(dir=p.parent, suffix=".tmp")
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata=meta)
            os.replace(tmp, p)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def missing(self, prompts: Sequence[str]) -> list[str]:
        return [p for p in dict.fromkeys(prompts) if not self.path(p).exists()]
