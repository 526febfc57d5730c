"""Checkpoint integrity: each file's size and xxh3-128, hashed as it is written, checked on resume.

    save:    every writer hashes the bytes it hands to the file (no second read)
             rank r's DCP shards --dcp_hashing.HashingStorageWriter--> rank r's Digests --+
             optimizer.json / policy.safetensors / ... --> lead's Digests -------------+--> manifest.json
                                          (gathered to the committing rank, merged, checked
                                           against the folder: every file hashed, sizes agree)
    resume:  verify_checkpoint reads every file once, one thread per file (the hash and the
             reads release the GIL), and names the first file that is missing, of another
             size or of another hash

Why xxh3-128 (the `xxhash` wheel) and not sha256: the manifest guards against accidents (a
truncated copy, a full disk, a flipped bit), not against someone forging a file, so collision
resistance against an adversary buys nothing, while speed decides whether the check is paid
at every save and resume. In memory, on one core of this project's machine, xxh3-128 hashes
over ten times faster than sha256 and several times faster than blake3, well above disk
bandwidth (`benchmarks/checkpoint_integrity.py --hash-speed` prints the figures;
docs/measurements/runtime.md "Checkpoint integrity" quotes a run), so hashing adds CPU time to the
write instead of a second read of every byte. 128 bits make an accidental match ~2^-128 per
damaged file.

Manifest formats on disk:
  format 2 (now): {"format": 2, "hash": "xxh3_128", "files": {rel: {"bytes": n, "xxh3_128": hex}}}
  format 1 (checkpoints written before this module): {"files": {rel: {"bytes": n, "sha256": hex}}}
Both verify: the entry key names the hash (sha256 stays in hashlib), so a run that saved under
format 1 resumes after an upgrade, checked as strictly as before, only slower.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Iterator, Optional

import torch
import xxhash

HASH = "xxh3_128"
FORMAT = 2
_HASHES = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}  # sha256: format-1 manifests
_READ_CHUNK = 1 << 24  # 16 MiB reads when verifying


class CheckpointError(ValueError):
    """A checkpoint folder that does not match its manifest (truncated, damaged, incomplete);
    the message names the file and how."""


class Digests:
    """Size and hash of the files one process wrote, keyed by path relative to `root`
    (the checkpoint folder). Thread-safe: DCP may write a rank's files from several threads."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.files: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def record(self, path: Path, nbytes: int, digest: str) -> None:
        rel = Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        with self._lock:
            self.files[rel] = {"bytes": nbytes, HASH: digest}

    @contextlib.contextmanager
    def open(self, path: Path) -> Iterator[IO[bytes]]:
        """A binary file opened for writing whose bytes are hashed on their way out."""
        with _HashingFile(path, self) as f:
            yield f

    def write_bytes(self, path: Path, data: bytes) -> None:
        with self.open(path) as f:
            f.write(data)

    def save_safetensors(self, tensors: dict[str, torch.Tensor], path: Path,
                         metadata: Optional[dict[str, str]] = None) -> None:
        """`safetensors.torch.save_file`, hashed from memory in file order (no read-back of
        the data).

        save_file writes the file straight from the tensors' memory: 8-byte header length,
        JSON header, then each tensor's bytes at its `data_offsets`. The format forbids holes
        in the data region, so hashing the header (read back: a few KiB) and then each
        tensor's memory in offset order hashes exactly the bytes on disk.
        """
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        save_file(tensors, str(path), metadata=metadata)
        with open(path, "rb") as f:
            head = f.read(8)
            header = f.read(struct.unpack("<Q", head)[0])
        h = _HASHES[HASH]()
        h.update(head)
        h.update(header)
        entries = sorted((v["data_offsets"], k) for k, v in json.loads(header).items() if k != "__metadata__")
        end = 0
        for (begin, stop), name in entries:
            if begin != end:  # cannot happen for a valid safetensors file; a hash of other bytes would
                raise RuntimeError(f"{path}: {name} starts at data offset {begin}, expected {end}")
            h.update(_bytes_of(tensors[name]))
            end = stop
        size = len(head) + len(header) + end
        if size != path.stat().st_size:
            raise RuntimeError(f"{path}: safetensors wrote {path.stat().st_size} bytes, its header accounts "
                                 f"for {size}")
        self.record(path, size, h.hexdigest())


class _HashingFile(io.BufferedWriter):
    """A buffered binary file that feeds every written byte to the hash; on close it records
    (size, digest) in its Digests. Keeps fileno() (DCP fsyncs it) and tell()."""

    def __init__(self, path: Path, digests: Digests):
        super().__init__(io.FileIO(str(path), "wb"))
        self._path, self._digests = Path(path), digests
        self._hash = _HASHES[HASH]()
        self._nbytes = 0

    def write(self, b) -> int:  # type: ignore[override]
        view = memoryview(b)
        self._hash.update(view)
        self._nbytes += view.nbytes
        return super().write(view)

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._digests.record(self._path, self._nbytes, self._hash.hexdigest())


def manifest(files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The manifest.json tree (format 2) of merged per-rank Digests.files."""
    return {"format": FORMAT, "hash": HASH, "files": dict(sorted(files.items()))}


def check_written(root: Path, files: dict[str, dict[str, Any]], on_disk: list[Path]) -> None:
    """Every file in the folder was hashed as written, and is as long as what was written.

    A stat per file, no read. A file no writer hashed is a bug in the save path (a writer
    that bypasses Digests); a size that differs means the file changed after it was written.
    """
    have = {p.relative_to(root).as_posix(): p.stat().st_size for p in on_disk}
    unhashed, lost = sorted(set(have) - set(files)), sorted(set(files) - set(have))
    if unhashed or lost:
        raise RuntimeError(f"{root}: files written without a hash: {unhashed}; hashed but not on disk: {lost}")
    for rel, entry in files.items():
        if have[rel] != entry["bytes"]:
            raise RuntimeError(f"{root}: {rel} has {have[rel]} bytes on disk, {entry['bytes']} were written")


def verify(root: Path, tree: dict[str, Any], threads: Optional[int] = None) -> None:
    """Raise CheckpointError naming the first (sorted) file of manifest `tree` that is missing,
    of another size or of another hash. Sizes first (a stat each), then the hashes, one
    thread per file (at most `threads`; default: ThreadPoolExecutor's)."""
    files = tree["files"]
    for rel, want in files.items():
        path = root / rel
        if not path.is_file():
            raise CheckpointError(f"{root}: {rel} is missing")
        size = path.stat().st_size
        if size != want["bytes"]:
            raise CheckpointError(f"{root}: {rel} has {size} bytes, the manifest says {want['bytes']} "
                                 "(truncated or overwritten)")

    wanted = {}  # rel -> (hash name, hex digest): the one key of an entry besides "bytes"
    for rel, want in files.items():
        named = [(k, v) for k, v in want.items() if k != "bytes"]
        if len(named) != 1 or named[0][0] not in _HASHES:
            raise CheckpointError(f"{root}: {rel}: the manifest entry {want} names no hash this version checks "
                                 f"(known: {sorted(_HASHES)})")
        wanted[rel] = named[0]

    def check(rel: str) -> Optional[str]:
        name, digest = wanted[rel]
        if hash_file(root / rel, name) != digest:
            return f"{root}: {rel} does not match its {name} in the manifest (damaged)"
        return None

    with ThreadPoolExecutor(threads) as pool:
        problems = [p for p in pool.map(check, sorted(wanted)) if p is not None]
    if problems:
        raise CheckpointError(problems[0] + (f" (and {len(problems) - 1} more files)" if len(problems) > 1 else ""))


def hash_file(path: Path, name: str = HASH) -> str:
    """Hex digest of a whole file, read in 16 MiB chunks into one reused buffer."""
    h = _HASHES[name]()
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, as safetensors writes them (this host's
    byte order; safetensors is little-endian, as every host torch ships for)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())
