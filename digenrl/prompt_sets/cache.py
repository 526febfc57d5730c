"""Download, cache and verify the files of the named prompt sets (registry.py).

    path = ensure(PROMPT_SETS["pickscore"], "test")   # cached file, digests checked

The cache is $DIGENRL_CACHE/prompt_sets/<name>/<revision>/<file> (default
~/.cache/digenrl/...). A cached file is checked against the registry's digests on every
load, a download before it is written; writes go to a temporary file in the same folder
and are renamed into place, so a reader never sees half a file and two processes fetching
at once (Ray workers) both end with a whole one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Optional
from urllib.error import URLError
from urllib.request import urlopen

from digenrl.prompt_sets.registry import PromptFile, PromptSet

OFFLINE_VARS = ("HF_HUB_OFFLINE", "DIGENRL_OFFLINE")  # either set to 1: never try the network
CHUNK = 1 << 16


class PromptSetError(ValueError):
    """A named prompt set cannot be read: unknown, not fetched, or not the recorded bytes."""


def cache_root() -> Path:
    return Path(os.environ.get("DIGENRL_CACHE", Path.home() / ".cache" / "digenrl")) / "prompt_sets"


def cache_path(s: PromptSet, split: str) -> Path:
    return cache_root() / s.name / s.revision / s.splits[split].filename


def offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARS)


def git_blob_sha1(data: bytes) -> str:
    """The id git gives `data` as a blob: sha1(b"blob <size>\\0" + data)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_digests(f: PromptFile, data: bytes, where: str) -> None:
    """Raise PromptSetError naming `where`, the digest, expected and got, on any mismatch."""
    got = {"git blob sha1": git_blob_sha1(data), "sha256": hashlib.sha256(data).hexdigest()}
    expected = {"git blob sha1": f.git_sha1, "sha256": f.sha256}
    for kind, want in expected.items():
        if want is not None and got[kind] != want:
            raise PromptSetError(f"{where}: {kind} mismatch: expected {want}, got {got[kind]} "
                                 f"({len(data)} bytes; not the file of the pinned revision)")


def ensure(s: PromptSet, split: str, *, progress: bool = False) -> Path:
    """The cached, verified file of `s`'s `split`, downloading it first if it is not cached."""
    path = cache_path(s, split)
    f = s.splits[split]
    if path.exists():
        check_digests(f, path.read_bytes(), str(path))
        return path
    if offline():
        raise PromptSetError(_not_cached(s, split, f"this machine is offline ({_offline_vars()})"))
    data, errors = None, []
    for url in f.urls():
        try:
            data = _download(url, f.size, progress, f"{s.name}:{split}")
            break
        except (URLError, OSError) as e:  # no network, a proxy, a 404 from one mirror: try the next
            errors.append(f"{url}: {e}")
    if data is None:
        raise PromptSetError(_not_cached(s, split, "no download succeeded:\n    " + "\n    ".join(errors)))
    check_digests(f, data, url)  # the URL that answered
    _write_atomic(path, data)
    return path


def _download(url: str, size: Optional[int], progress: bool, label: str) -> bytes:
    from tqdm.auto import tqdm

    chunks = []
    with urlopen(url, timeout=60) as r, tqdm(total=size, unit="B", unit_scale=True, desc=label,
                                            disable=None if progress else True) as bar:  # None: off in a file
        while block := r.read(CHUNK):
            chunks.append(block)
            bar.update(len(block))
    return b"".join(chunks)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _offline_vars() -> str:
    return ", ".join(f"{v}={os.environ[v]}" for v in OFFLINE_VARS if v in os.environ)


def _not_cached(s: PromptSet, split: str, why: str) -> str:
    path = cache_path(s, split)
    rel = path.relative_to(cache_root().parent)
    return (f"prompt set {s.name!r} ({split} split) is not cached at {path}, and {why}\n"
            f"  source: {s.splits[split].urls()[0]}\n"
            f"  on a machine with network run:  digenrl prompts fetch {s.name} --split {split}\n"
            f"  then copy that machine's $DIGENRL_CACHE/{rel} (default ~/.cache/digenrl/{rel}) to {path}")
