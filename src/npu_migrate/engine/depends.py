"""The files besides its own that a file's result was computed from, for the result cache.

A rule may read another file to decide on this one (NPU703 follows `from .rope import rotate_half` into
`rope.py`, `transforms/fused/imported.py`): the result then depends on that file's content too, and an
entry filed under this file's bytes alone would answer a run after the sibling was edited with the old
result. While a file is migrated for the cache (`runner.process_and_store`), every file a rule reads,
or looks for and does not find, is recorded here with the SHA-256 of what it read (None: no such file);
the cache stores the list with the entry and trusts the entry only while each of those files still
reads the same (`Cache.get`). Outside a recording, `record` does nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: path -> SHA-256 hex of its bytes, or None where no regular file was there; None: nobody records.
_recorded: dict[str, str | None] | None = None


def read(path: Path, limit: int) -> bytes | None:
    """The bytes of the regular file at `path` (None: absent, not a regular file, unreadable, or larger
    than `limit` bytes), recorded as a dependency of the file being migrated either way."""
    data: bytes | None = None
    try:
        info = os.stat(path)
        if stat.S_ISREG(info.st_mode):
            with open(path, "rb") as file:
                data = file.read()
    except OSError:
        data = None
    record(path, data)
    return data if data is not None and len(data) <= limit else None


def record(path: Path, data: bytes | None) -> None:
    if _recorded is not None:
        _recorded[os.path.abspath(path)] = None if data is None else hashlib.sha256(data).hexdigest()


@contextmanager
def recording() -> Iterator[dict[str, str | None]]:
    """Collect the files read while the block runs (a fresh, empty record each time; nested: the inner)."""
    global _recorded
    previous, _recorded = _recorded, {}
    try:
        yield _recorded
    finally:
        _recorded = previous


def digest(path: str) -> str | None:
    """What `record` would say of `path` now."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as file:
            return hashlib.sha256(file.read()).hexdigest()
    except OSError:
        return None


def unchanged(files: Iterable[tuple[str, str | None]]) -> bool:
    """Whether every recorded file still reads as it did (or is still absent)."""
    return all(digest(path) == sha for path, sha in files)
