"""Reading and writing source files without losing a byte.

A file is decoded the way Python itself would (PEP 263 coding cookie, UTF-8 BOM) and encoded back the
same way; newlines are never translated, so CRLF and mixed-newline files come back exactly as they were.
Writes are atomic: a temporary file in the same folder, fsync, then rename over the original.
"""

from __future__ import annotations

import ast
import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path


class SourceError(Exception):
    """A file that cannot be processed; the message is the one-line reason shown to the user."""


@dataclass(frozen=True)
class SourceFile:
    path: Path
    raw: bytes
    text: str
    encoding: str

    def encode(self, text: str) -> bytes:
        # "utf-8-sig" writes the BOM back, so a BOM file keeps its BOM.
        return text.encode(self.encoding)


def decode_source(path: Path, raw: bytes) -> SourceFile:
    if b"\x00" in raw:
        raise SourceError("binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        if "invalid or missing encoding declaration" in str(exc):
            raise SourceError("cannot decode as utf-8 and no coding cookie says otherwise") from None
        raise SourceError(f"bad coding cookie: {exc}") from None
    try:
        text = raw.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise SourceError(f"cannot decode as {encoding}: {exc}") from None
    return SourceFile(path=path, raw=raw, text=text, encoding=encoding)


def parse_python(text: str, display: str) -> ast.Module:
    """CPython's parse of a file, with its failures as one-line reasons.

    Run before libcst sees a file: it is an order of magnitude cheaper, gives the familiar syntax error
    messages, and refuses nesting deep enough to crash libcst's native parser (seen: a segfault at 5,000
    nested parentheses). Code CPython cannot parse cannot run either.
    """
    try:
        return ast.parse(text, filename=display)
    except SyntaxError as exc:
        raise SourceError(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise SourceError("too deeply nested (or otherwise too large) to parse") from None


def read_source(path: Path) -> SourceFile:
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise SourceError("not a regular file (a FIFO, device or socket); not read")
        raw = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror or exc}") from None
    return decode_source(path, raw)


def _new_file_mode() -> int:
    """The mode `open()` gives a new file under this process's umask (read once, at import: setting the
    umask to read it is not thread-safe)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


_NEW_FILE_MODE = _new_file_mode()


def atomic_write(path: Path, data: bytes, *, expected: bytes | None = None, mode: int | None = None) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file, never a mix.

    With `expected`, the file must still hold exactly those bytes: a file edited while the run was in
    flight is not overwritten. The file keeps its mode bits; `mode` sets them instead (an output tree's
    copy takes its source's, so a launch script stays executable), and a new file without one gets what
    `open()` would give it, not the temporary file's 0600.
    """
    if path.is_symlink():
        raise SourceError("is a symbolic link; not written through")
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    if expected is not None:
        try:
            current = path.read_bytes()
        except OSError as exc:
            raise SourceError(f"cannot re-read before writing: {exc.strerror or exc}") from None
        if current != expected:
            raise SourceError("changed on disk while npu-migrate was running; not overwritten")
    # Mode bits, not os.access: root may write anything, but a read-only file says "leave me".
    if st is not None and not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise SourceError("file is read-only; not written")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npu-migrate.tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, mode if mode is not None else stat.S_IMODE(st.st_mode) if st else _NEW_FILE_MODE)
        if st is not None:
            try:
                os.chown(tmp_name, st.st_uid, st.st_gid)
            except (PermissionError, AttributeError):
                pass  # only root may give a file away; keeping the mode is what matters then
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
