"""The per-file result cache: an unchanged file under unchanged settings is answered without migrating it.

`apply --diff` / `--check` (and `apply` in place, for files that need no change) look each file up before
starting any worker; `analyze` shares the same entries for its rule findings. A file's entry is keyed by
everything its result depends on:

* the file's bytes (their SHA-256; the main process hashes what it reads, the worker what *it* reads, so an
  entry is never filed under content the result was not computed from);
* the tool: a hash of every source, table and template file of the installed package (rules change during
  development without a version bump), the Python version (what `ast` accepts), libcst's version, and
  jinja2's (it renders the injected helpers);
* the run's settings that reach a file: the enabled rules, the torch_npu version, the target and its torch
  version, `--annotate`;
* the job: the name it is shown under (findings and diffs quote it), its kind, its per-file ignores, and the
  helper module its package allows (which `__init__.py` files exist above it: `packages.helper_module`) or
  its script folder's files prove (which siblings import it or it imports: `packages.sibling_modules`).

and, stored with the entry rather than in its key (they are only known once the file was migrated), the
other files a rule read for it (NPU703 follows a helper imported from a sibling module: `depends`), each
with the SHA-256 of what it read or "absent": the entry is trusted only while every one reads the same.

A result's write (in place or into `--output`) is never taken from the cache: in place, only an entry saying
"nothing to change" is used, and it was found under the SHA-256 of the bytes just read, so the file is still
what the cache saw; `--output` does not read the cache at all. Failures are not stored (a timeout or a worker
crash says nothing about the next run).

On disk: `<project>/.npu_migrate_cache/<tool fingerprint>/<2 hex>/<key>.json`, with its own `.gitignore`
(`<project>`: `cache_root`, decided from the inputs, never the working folder alone)
(like ruff's `.ruff_cache`). An entry is written to a temporary file and renamed into place, so two runs at
once (two pre-commit hooks) each see a whole entry or none; each entry carries a checksum of its body, so an
entry torn by a crash or a full disk, or edited by hand, reads as absent. Entries are JSON, never pickle:
reading a cache folder someone committed must not run code. Any error of the cache itself (a read-only
project, a full disk) turns it off for the file, silently: the cache may make a run faster, never different.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from npu_migrate.findings import Finding, FindingData, Severity

if TYPE_CHECKING:
    from npu_migrate.engine.pipeline import FileResult, Job, Plan

#: The cache folder's name, in the project's root (`cache_root`).
FOLDER = ".npu_migrate_cache"
#: What marks a project's root above the inputs, as ruff finds where its `.ruff_cache` goes.
_ROOT_MARKERS = (".git", "pyproject.toml")
#: Bumped when the entry format changes; part of every key.
FORMAT = 1
_MAGIC = b"npu-migrate-cache"
#: Another tool fingerprint's folder untouched this long is removed (old versions of the tool, edited rules).
STALE_SECONDS = 7 * 24 * 3600
#: The package's files whose content decides a result: code, rule tables, templates of injected code.
_SUFFIXES = (".py", ".toml", ".j2")

_TOOL_FINGERPRINT: str | None = None


def tool_fingerprint() -> str:
    """A hash of the installed package's source, tables and templates, the Python version, and the versions
    of libcst (which parses and prints) and jinja2 (which renders the injected helpers): once per process
    (about 200 small files; a few milliseconds)."""
    global _TOOL_FINGERPRINT
    if _TOOL_FINGERPRINT is None:
        import importlib.util

        digest = hashlib.sha256(f"format {FORMAT}\npython {sys.version_info[:3]}\n".encode())
        # Each version by the small file that holds it (importlib.metadata costs more start-up than the whole
        # look-up): libcst's `_version.py`, jinja2's `__init__.py` (its `__version__`).
        for dependency, version_name in (("libcst", "_version.py"), ("jinja2", "__init__.py")):
            spec = importlib.util.find_spec(dependency)
            if spec is not None and spec.submodule_search_locations:
                version_file = Path(next(iter(spec.submodule_search_locations)), version_name)
                digest.update(version_file.read_bytes() if version_file.is_file() else str(version_file).encode())
        roots = []
        for package in ("npu_migrate", "npu_migrate.transforms", "npu_migrate.templates"):
            spec = importlib.util.find_spec(package)  # finds a subpackage without running its __init__
            if spec is not None and spec.submodule_search_locations:
                roots.extend(Path(p) for p in spec.submodule_search_locations)
        for root in roots:
            for path in sorted(p for p in root.rglob("*") if p.suffix in _SUFFIXES and "__pycache__" not in p.parts):
                digest.update(f"{path.relative_to(root).as_posix()}\n".encode())
                digest.update(hashlib.sha256(path.read_bytes()).digest())
        _TOOL_FINGERPRINT = digest.hexdigest()[:24]
    return _TOOL_FINGERPRINT


def cache_root(paths: list[Path], config_path: Path | None = None) -> Path:
    """Where a run on `paths` keeps its cache: the folder of the configuration (`config_path`, the
    pyproject.toml in force) when every input lies under it; else the nearest folder above the inputs'
    common folder that holds `.git` or `pyproject.toml`; else that common folder. Never the working folder
    for inputs elsewhere: a run from a repository on /tmp/x.py must not write the cache into the repository."""
    dirs = [os.path.abspath(p) if os.path.isdir(p) else os.path.dirname(os.path.abspath(p)) for p in paths]
    common = Path(os.path.commonpath(dirs)) if dirs else Path(os.path.abspath(os.curdir))
    if config_path is not None:
        project = Path(os.path.abspath(config_path)).parent
        if common == project or project in common.parents:
            return project
    for folder in (common, *common.parents):
        if any((folder / marker).exists() for marker in _ROOT_MARKERS):
            return folder
    return common


def plan_fingerprint(plan: Plan) -> str:
    """What in a `Plan` reaches a file's result (not the mode, the time limit nor the output folder: only
    unfailed results are stored, and they are the same whether or not they are written)."""
    enabled = None if plan.enabled is None else sorted(plan.enabled)
    fields = [enabled, plan.torch_npu_version, plan.target, plan.torch_version, plan.annotate]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


@dataclass(frozen=True)
class Cache:
    """Where a run's entries live and the part of their key the whole run shares. Picklable: it goes to
    the workers, which store what they compute."""

    folder: Path  # <project>/.npu_migrate_cache/<tool fingerprint>
    run_key: str  # plan_fingerprint

    @classmethod
    def open(cls, project_root: Path, plan: Plan) -> Cache | None:
        """The cache of the project at `project_root` for `plan`, or None where it cannot be created."""
        top = project_root / FOLDER
        try:
            fresh = not top.is_dir()
            top.mkdir(exist_ok=True)
            if fresh or not (top / ".gitignore").is_file():
                _write_atomic(top / ".gitignore", b"# Created by npu-migrate automatically.\n*\n")
                _write_atomic(top / "CACHEDIR.TAG", b"Signature: 8a477f597d28d172789f06886806bc55\n")
            folder = top / tool_fingerprint()
            folder.mkdir(exist_ok=True)
            os.utime(folder)  # in use: not stale
        except OSError:
            return None
        _prune(top, keep=folder.name)
        return cls(folder, plan_fingerprint(plan))

    def key(self, job: Job, raw: bytes) -> str:
        from npu_migrate.files import kinds
        from npu_migrate.program.packages import helper_module, is_sibling

        # Whether the file is a package's module changes NPU001's message; `apply` says so in a relative
        # `job.helper_module`, `analyze`'s jobs carry none, so it is asked of the file's place. A sibling
        # module (a script folder's, decided from the folder's files) says the file is of no package.
        if job.helper_module is not None:
            package = not is_sibling(job.helper_module)
        else:
            package = helper_module(job.path) is not None
        job_fields = [self.run_key, job.display, kinds.kind_of(job.path), list(job.ignore), job.helper_module, package]
        digest = hashlib.sha256(json.dumps(job_fields).encode())
        digest.update(hashlib.sha256(raw).digest())
        return digest.hexdigest()

    def _path(self, key: str) -> str:
        # A string, not a Path: pathlib's parsing was a third of a warm run's look-ups.
        return f"{self.folder}{os.sep}{key[:2]}{os.sep}{key}.json"

    def has(self, key: str) -> bool:
        """Whether an entry is there (not whether it is whole: `get` says that)."""
        return os.path.isfile(self._path(key))

    def get(self, key: str) -> FileResult | None:
        """The stored result, or None: absent, torn, or not what this format writes."""
        try:
            with open(self._path(key), "rb") as entry:
                data = entry.read()
        except OSError:
            return None
        header, _, body = data.partition(b"\n")
        if header != _MAGIC + b" " + hashlib.sha256(body).hexdigest().encode():
            return None
        try:
            doc = json.loads(body)
            read = [(str(path), None if sha is None else str(sha)) for path, sha in doc.get("depends", ())]
            result = _result(doc)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        from npu_migrate.engine import depends

        # Computed from a sibling file that has changed since (or appeared, or gone): not this run's result.
        return result if depends.unchanged(read) else None

    def put(self, key: str, result: FileResult, read: dict[str, str | None] | None = None) -> None:
        """File `result` under `key`, with the other files its rules read (`depends`) and their digests."""
        from npu_migrate.engine.pipeline import Status

        if result.status is Status.FAILED:
            return
        doc = _document(result)
        if read:
            doc["depends"] = sorted([path, sha] for path, sha in read.items())
        body = json.dumps(doc, separators=(",", ":")).encode()
        path = Path(self._path(key))
        try:
            path.parent.mkdir(exist_ok=True)
            _write_atomic(path, _MAGIC + b" " + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
        except OSError:
            pass  # a full disk or a read-only project: the next run computes the file again


def read_for_key(path: Path) -> bytes | None:
    """The bytes of a regular file, or None (a FIFO must not block the look-up; the worker reports it)."""
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before opening: opening a FIFO waits for a writer
            return None
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would lock a shared CI cache to one user
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _prune(top: Path, keep: str) -> None:
    """Remove the folders of other tool fingerprints nobody has used for a week."""
    now = time.time()
    try:
        for child in top.iterdir():
            if child.name != keep and child.is_dir() and now - child.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(child, ignore_errors=True)
    except OSError:
        pass


def _document(result: FileResult) -> dict:
    return {
        "display": result.display,
        "status": result.status.value,
        "findings": [
            [f.rule_id, f.path, f.line, f.col, f.message, f.severity.value, f.fixed, f.original, f.replacement]
            + [dict(f.data)]
            for f in result.findings
        ],
        "diff": result.diff,
        "error": result.error,
        "parsed": result.parsed,
        "helper_module": result.helper_module,
        "helper_imports": list(result.helper_imports),
    }


def _result(doc: dict) -> FileResult:
    from npu_migrate.engine.pipeline import FileResult, Status

    findings = []
    for rule_id, path, line, col, message, severity, fixed, original, replacement, data in doc["findings"]:
        severity, data = Severity(severity), FindingData.of(data)
        findings.append(Finding(rule_id, path, line, col, message, severity, fixed, original, replacement, data))
    return FileResult(
        doc["display"],
        Status(doc["status"]),
        findings,
        diff=doc["diff"],
        error=doc["error"],
        parsed=doc["parsed"],
        helper_module=doc["helper_module"],
        helper_imports=tuple(doc["helper_imports"]),
    )
