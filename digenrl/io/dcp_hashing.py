"""DCP's safetensors writer, with each file hashed while this rank writes it.

Kept apart from `integrity` because importing torch.distributed.checkpoint takes seconds:
only a sharded save pays for it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from digenrl.io.integrity import Digests


class _HashingFileSystem(FileSystem):
    """DCP's local file system whose binary write streams hash what they write (Digests.open)."""

    def __init__(self, digests: Digests):
        self.digests = digests

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        if mode != "wb":  # reads, and text files DCP writes in other modes (none with our options)
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with self.digests.open(Path(path)) as stream:
            yield stream


class HashingStorageWriter(HuggingFaceStorageWriter):
    """DCP's safetensors writer whose files are hashed while this rank writes them.

    The hook is the writer's `fs` (its FileSystemBase), the attribute torch's own
    FsspecWriter replaces the same way: every shard file goes through `fs.create_stream`.
    """

    def __init__(self, path: str, digests: Digests, **kwargs: Any):
        super().__init__(path, **kwargs)
        self.fs = _HashingFileSystem(digests)
