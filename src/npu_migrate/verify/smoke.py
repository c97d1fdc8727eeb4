"""`npu-migrate verify --smoke`: run a migrated program's entry on a simulated Ascend host, report crashes.

The entry runs in a fresh interpreter (`smoke_worker`) made to look like an Ascend host (`npu_host`):
a factory (`build()` -> (model, inputs): forward, backward, an optimizer step), a module to import, or a
script with arguments. A crash is reported at the innermost frame inside the migrated tree; with the
original tree the rewrites behind it are named (`blame`), and the original entry is run on a plain
CPU host to tell a failure the migration caused from one the program had anyway.

Exit codes (`SmokeReport.exit_code`): 0 the entry ran; 1 the migrated program crashed, a fused op
rejected its arguments, or it reached something the simulated host does not model; 2 usage errors,
and failures the original has too on a CPU host (same file, line and exception type).

    from npu_migrate.verify import smoke
    report = smoke.run("src_npu", script="src_npu/train.py", args=["--steps", "1"], original="src")
    assert report.passed, report.to_text()
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from npu_migrate.verify.blame import Attribution, attribute

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
_LABELS = {
    "crash": "CRASH",
    "npu_op": "FUSED OP REJECTED",
    "not_modelled": "NOT MODELLED",
}
_LOG_TAIL = 4000


class SmokeUsageError(Exception):
    """Bad arguments, an entry that does not exist, or a worker that could not report; `detail` holds a log."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


@dataclass
class Crash:
    kind: str  # "crash", "npu_op" (a fused op rejected its arguments) or "not_modelled"
    type: str
    message: str
    file: str  # relative to the migrated tree when inside it
    line: int
    code: str
    in_tree: bool
    traceback: str = ""
    attribution: Attribution | None = None

    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("traceback")
        data["attribution"] = self.attribution.to_dict() if self.attribution else None
        return data


@dataclass
class SmokeReport:
    entry: str
    migrated: str
    torch_npu_version: str
    device_count: int
    steps: list[str] = field(default_factory=list)
    fused_calls: dict[str, int] = field(default_factory=dict)
    crash: Crash | None = None
    #: Where the original entry failed on a CPU host, when it was run (--original, after a crash).
    original_failure: str = ""
    same_failure_in_original: bool = False
    output_tail: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.crash is None

    @property
    def exit_code(self) -> int:
        if self.passed:
            return EXIT_OK
        return EXIT_ERROR if self.same_failure_in_original else EXIT_FAILED

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("output_tail")
        data["crash"] = self.crash.to_dict() if self.crash else None
        data["passed"] = self.passed
        data["exit_code"] = self.exit_code
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self, verbose: bool = False) -> str:
        devices = f"{self.device_count} NPU" + ("s" if self.device_count > 1 else "")
        lines = [
            f"npu-migrate verify --smoke: {self.entry} on a simulated Ascend host "
            f"(torch_npu {self.torch_npu_version}, {devices}, computing on the CPU)",
            f"ran: {', '.join(self.steps) or 'nothing'}",
        ]
        if self.fused_calls:
            lines.append("fused ops called: " + "  ".join(f"{op} x{n}" for op, n in self.fused_calls.items()))
        crash = self.crash
        if crash is not None:
            lines.append(f"{_LABELS.get(crash.kind, 'CRASH')} at {crash.location()}: {crash.type}: {crash.message}")
            if crash.code:
                lines.append(f"    {crash.code.strip()}")
            lines.extend(_attribution_lines(crash))
            if self.same_failure_in_original:
                lines.append(
                    f"the original fails the same way on a CPU host ({self.original_failure}): "
                    "not caused by the migration"
                )
            elif self.original_failure:
                lines.append(f"(the original, on a CPU host, fails elsewhere: {self.original_failure})")
            if verbose:
                lines.append(crash.traceback.rstrip())
        if verbose and self.output_tail:
            lines.append("program output (tail):")
            lines.append(self.output_tail.rstrip())
        outcome = "PASS" if self.passed else f"FAIL (exit {self.exit_code})"
        lines.append(f"result: {outcome} ({self.seconds:.1f}s)")
        return "\n".join(lines)


def _attribution_lines(crash: Crash) -> list[str]:
    attribution = crash.attribution
    if attribution is None:
        return []
    if not attribution.causes:
        return [
            f"no rewrite or finding of the codemod at or around {attribution.original_file}:"
            f"{attribution.original_line} (the original line)"
        ]
    lines = [f"rewrites and findings behind it (original {attribution.original_file}:{attribution.original_line}):"]
    lines.extend(f"  {cause.describe()}" for cause in attribution.causes)
    return lines


def _entry(factory, module, script) -> tuple[str, str]:
    given = [(kind, value) for kind, value in (("factory", factory), ("module", module), ("script", script)) if value]
    if len(given) != 1:
        raise SmokeUsageError("give exactly one entry: --factory FILE, --module NAME or --script FILE")
    kind, value = given[0]
    if kind != "module":
        path = Path(value)
        if not path.is_file():
            raise SmokeUsageError(f"--{kind} {value}: no such file")
        return kind, str(path.resolve())
    return kind, str(value)


def run(
    migrated,
    *,
    factory=None,
    module: str | None = None,
    script=None,
    args: Sequence[str] = (),
    original=None,
    torch_npu_version: str | None = None,
    device_count: int = 1,
    timeout: float | None = None,
) -> SmokeReport:
    """Run one entry of the migrated tree on a simulated NPU host; see the module docstring."""
    from npu_migrate.program.api import NpuApi, UnknownVersionError

    started = time.monotonic()
    migrated = Path(migrated)
    if not migrated.is_dir():
        raise SmokeUsageError(f"--migrated {migrated}: not a directory")
    if original is not None:
        original = Path(original)
        if not original.is_dir():
            raise SmokeUsageError(f"--original {original}: not a directory")
        if original.resolve() == migrated.resolve():
            raise SmokeUsageError("--original and --migrated are the same directory")
    if device_count < 1:
        raise SmokeUsageError(f"--device-count {device_count}: at least 1")
    try:
        version = NpuApi(torch_npu_version).version
    except UnknownVersionError as exc:
        raise SmokeUsageError(str(exc)) from None
    kind, entry = _entry(factory, module, script)
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # the worker would die before it could report anything
        from npu_migrate.verify.harness import INSTALL_HINT

        raise SmokeUsageError(
            f"verify --smoke runs your program and needs torch, which is not installed here: {INSTALL_HINT}"
        )
    described = {"factory": f"factory {factory}", "module": f"module {module}", "script": f"script {script}"}[kind]
    if args:
        described += " " + " ".join(args)

    result, log = _run_worker(migrated, kind, entry, list(args), "npu", version, device_count, timeout)
    report = SmokeReport(described, str(migrated), version, device_count, output_tail=log[-_LOG_TAIL:])
    report.steps = result["steps"]
    report.fused_calls = result["fused_calls"]
    error = result["error"]
    if error is not None:
        if error["kind"] == "usage":
            raise SmokeUsageError(
                f"{error['type']}: {error['message']}" if error["stage"] == "setup" else error["message"]
            )
        report.crash = _crash(error, migrated)
        if original is not None and report.crash.in_tree:
            report.crash.attribution = attribute(original, migrated, report.crash.file, report.crash.line, version)
        if original is not None and report.crash.kind == "crash":
            _compare_with_original(report, original, migrated, kind, entry, list(args), timeout)
    report.seconds = time.monotonic() - started
    return report


def _crash(error: dict, migrated: Path) -> Crash:
    where = error["where"]
    root = migrated.resolve()
    path = Path(where["file"])
    try:
        relative, in_tree = path.resolve().relative_to(root).as_posix(), True
    except ValueError:
        relative, in_tree = where["file"], False
    return Crash(
        kind=error["kind"],
        type=error["type"],
        message=error["message"],
        file=relative,
        line=where["line"],
        code=where.get("code", ""),
        in_tree=in_tree,
        traceback=error.get("traceback", ""),
    )


def _compare_with_original(report, original: Path, migrated: Path, kind, entry, args, timeout) -> None:
    """Run the original entry on a CPU host: the same failure there is not the migration's doing."""
    if kind in ("script", "factory"):
        try:
            entry = str(original.resolve() / Path(entry).relative_to(migrated.resolve()))
        except ValueError:
            pass  # a file outside the tree runs as it is
        if not Path(entry).is_file():
            return
    result, _ = _run_worker(original, kind, entry, args, "cpu", None, 1, timeout)
    error = result["error"]
    if error is None or error["kind"] == "usage":
        return
    theirs = _crash(error, original)
    report.original_failure = f"{theirs.location()}: {theirs.type}: {theirs.message}"
    attribution = report.crash.attribution
    mine_line = attribution.original_line if attribution else report.crash.line
    report.same_failure_in_original = (theirs.file, theirs.line, theirs.type) == (
        report.crash.file,
        mine_line,
        report.crash.type,
    )


def _run_worker(root: Path, kind, entry, args, host, version, device_count, timeout) -> tuple[dict, str]:
    import npu_migrate

    env = dict(
        os.environ,
        PYTHONDONTWRITEBYTECODE="1",
        # What an Ascend host has: no CUDA device, and no real torch_npu autoloaded by `import torch`.
        CUDA_VISIBLE_DEVICES="",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    package_parent = str(Path(npu_migrate.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="npu-migrate-smoke-") as tmp:
        out, log = Path(tmp, "result.json"), Path(tmp, "output.log")
        cmd = [sys.executable, "-m", "npu_migrate.verify.smoke_worker", "--root", str(root.resolve())]
        cmd += [
            "--kind",
            kind,
            "--entry",
            entry,
            "--host",
            host,
            "--device-count",
            str(device_count),
            "--out",
            str(out),
        ]
        if version:
            cmd += ["--torch-npu-version", version]
        cmd += ["--", *args]
        # A file, not a pipe, takes the program's output: nothing to drain while it runs.
        with open(log, "wb") as sink:
            try:
                proc = subprocess.run(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise SmokeUsageError(f"the {host} host run did not finish within {timeout:g}s") from None
        text = log.read_text(encoding="utf-8", errors="replace")
        if not out.is_file():
            raise SmokeUsageError(
                f"the smoke worker exited with status {proc.returncode} without a result "
                "(did the program end the interpreter with os._exit or crash it?)",
                text[-_LOG_TAIL:],
            )
        return json.loads(out.read_text(encoding="utf-8")), text
