"""`compare()`: build the same model from the original and the migrated tree, run both, compare outputs.

Exit-code semantics (used by the CLI): a `VerifyReport` whose `passed` is False is a failed check
(exit 1); `VerifyUsageError` is a problem with the inputs or the user's own code (exit 2). The line
between them: anything that also breaks the original side is the user's; anything that breaks only
the migrated side (an import error in rewritten code, a fused op rejecting its arguments) is the
migration's, and fails the check.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")
MODES = ("auto", "reference", "npu")


class VerifyUsageError(Exception):
    """Bad arguments or a failure in the user's own code; `detail` holds the traceback, if any."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


@dataclass
class OutputReport:
    name: str
    shape: list[int]
    dtype: str
    cosine: float
    max_abs_err: float
    #: max |migrated - original| over max |original|: element-wise ratios blow up near zero.
    max_rel_err: float
    #: Share of positions whose last-dim argmax agrees, for outputs named `*logits`; else None.
    top1: float | None
    passed: bool
    note: str = ""


@dataclass
class ModuleReport:
    name: str
    file: str
    #: `torch_npu.<op>(` occurrences in the module's source, per op.
    sites: dict[str, int]
    #: Fused-op calls made from the module during the one forward pass.
    calls: dict[str, int]


@dataclass
class VerifyReport:
    mode: str
    dtype: str
    seed: int
    min_cosine: float
    outputs: list[OutputReport] = field(default_factory=list)
    modules: list[ModuleReport] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error_detail: str = ""
    seconds: float = 0.0
    #: Ops each side dispatched in the forward pass ("original", "migrated") and, where the factory provides
    #: a loss, in a training step ("original training step", ...): `op_counts.OpCounter.to_dict`.
    op_counts: dict[str, dict] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def fused_calls(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for module in self.modules:
            for op, n in module.calls.items():
                total[op] = total.get(op, 0) + n
        return dict(sorted(total.items()))

    def output(self, name: str) -> OutputReport:
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(name)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("error_detail")
        data["passed"] = self.passed
        data["fused_calls"] = self.fused_calls
        for out in data["outputs"]:  # NaN is not JSON
            for key in ("cosine", "max_abs_err", "max_rel_err", "top1"):
                if isinstance(out[key], float) and not math.isfinite(out[key]):
                    out[key] = None if math.isnan(out[key]) else str(out[key])
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self, verbose: bool = False) -> str:
        how = {
            "reference": "fused branches run on CPU reference kernels in place of torch_npu",
            "npu": "fused branches run on the NPU",
        }.get(self.mode, self.mode)
        lines = [f"npu-migrate verify: {self.mode} mode ({how}), dtype {self.dtype}, seed {self.seed}"]
        if self.modules:
            lines.append(f"fused ops called per forward pass, by migrated module ({len(self.modules)}):")
            width = max(len(m.name) for m in self.modules)
            for m in self.modules:
                ops = sorted(set(m.sites) | set(m.calls))
                calls = "  ".join(f"{op} x{m.calls.get(op, 0)}" for op in ops) or "no fused op sites"
                lines.append(f"  {m.name:<{width}}  {calls}")
        from npu_migrate.verify.op_counts import table

        for suffix, what in (("", "forward pass"), (" training step", "training step (forward, loss, backward)")):
            if f"original{suffix}" in self.op_counts and f"migrated{suffix}" in self.op_counts:
                lines.append(f"operators dispatched per {what}, by family (counted at the dispatcher):")
                lines += table(self.op_counts[f"original{suffix}"], self.op_counts[f"migrated{suffix}"])
        if self.outputs:
            lines.append(f"outputs (pass: cosine >= {self.min_cosine:g}):")
            width = max(len(o.name) for o in self.outputs)
            for o in self.outputs:
                top1 = f"  top1 {o.top1:6.1%}" if o.top1 is not None else ""
                status = "ok" if o.passed else "FAIL"
                note = f"  ({o.note})" if o.note else ""
                lines.append(
                    f"  {o.name:<{width}}  {str(tuple(o.shape)):<14} cosine {o.cosine:.6f}  "
                    f"max_abs {o.max_abs_err:.3g}  max_rel {o.max_rel_err:.3g}{top1}  {status}{note}"
                )
        for w in self.warnings:
            lines.append(f"warning: {w}")
        for f in self.failures:
            lines.append(f"FAIL: {f}")
        if verbose and self.error_detail:
            lines.append(self.error_detail.rstrip())
        lines.append(f"result: {'PASS' if self.passed else 'FAIL'} ({self.seconds:.1f}s)")
        return "\n".join(lines)


def compare(
    original_dir,
    migrated_dir,
    factory,
    min_cosine: float = 0.99,
    dtype: str = "float32",
    seed: int = 0,
    mode: str = "auto",
    timeout: float | None = None,
) -> VerifyReport:
    """Build `factory`'s `build()` model from both trees in fresh processes and compare one forward pass.

    `mode`: "auto" runs the fused branches on an NPU when torch_npu and a device are present, else on the
    CPU reference; "reference" forces the CPU reference; "npu" requires the device.
    Raises VerifyUsageError for bad arguments and for failures of the user's code on the original side.
    """
    started = time.monotonic()
    original, migrated, factory = Path(original_dir), Path(migrated_dir), Path(factory)
    for label, path in (("--original", original), ("--migrated", migrated)):
        if not path.is_dir():
            raise VerifyUsageError(f"{label} {path}: not a directory")
    if not factory.is_file():
        raise VerifyUsageError(f"--factory {factory}: no such file")
    if dtype not in DTYPES:
        raise VerifyUsageError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if mode not in MODES:
        raise VerifyUsageError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    if not -1.0 <= min_cosine <= 1.0:
        raise VerifyUsageError(f"--min-cosine {min_cosine}: a cosine similarity lies in [-1, 1]")
    if original.resolve() == migrated.resolve():
        raise VerifyUsageError("--original and --migrated are the same directory")

    _need_torch()
    before, after = _run_pair(original, migrated, factory, dtype, seed, mode, timeout)
    report = VerifyReport(mode=after.get("mode", "?"), dtype=dtype, seed=seed, min_cosine=min_cosine)
    report.warnings.extend(before.get("warnings", []) + after.get("warnings", []))
    report.modules = [
        ModuleReport(name=name, file=info["file"], sites=dict(info["sites"]), calls=dict(info["calls"]))
        for name, info in after.get("modules", {}).items()
    ]
    for key, suffix in (("op_counts", ""), ("op_counts_step", " training step")):
        if key in before and key in after:
            report.op_counts.update({f"original{suffix}": before[key], f"migrated{suffix}": after[key]})
    error = before.get("error")
    if error:
        raise VerifyUsageError(_describe(error, "in the original tree"), error.get("traceback", ""))
    error = after.get("error")
    if error:
        if error["stage"] == "setup" or error["type"] == "UsageError":
            raise VerifyUsageError(_describe(error, "in the migrated tree"), error.get("traceback", ""))
        if error.get("not_modelled"):
            report.failures.append(f"not verified: {error['message']} ({error['where']})")
        elif error.get("npu_op"):
            report.failures.append(
                f"a fused branch calls torch_npu with arguments the device rejects: {error['message']} "
                f"({error['where']})"
            )
        else:
            report.failures.append(
                f"the migrated code fails where the original runs ({error['stage']}): "
                f"{error['where']}: {error['type']}: {error['message']}"
            )
        report.error_detail = error.get("traceback", "")
    else:
        _compare_outputs(before["outputs"], after["outputs"], report)
        _check_fused_ran(report)
    report.seconds = time.monotonic() - started
    return report


def _describe(error: dict, side: str) -> str:
    stage = {
        "import": "importing the factory",
        "build": "build()",
        "forward": "the forward pass",
        "setup": "setting up",
    }.get(error["stage"], error["stage"])
    return f"{error['where']}: {error['type']}: {error['message']} ({stage}, {side})"


#: What installs what verify runs with: torch (and the models' packages) come with the `integration` extra.
INSTALL_HINT = (
    "pip install torch (or, in npu-migrate's checkout, pip install '.[integration]': torch CPU, transformers)"
)


def _need_torch() -> None:
    """verify runs the user's model in workers of this interpreter: without torch they die before they can
    report anything, so say so here, with the command that installs it."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise VerifyUsageError(f"verify runs your model and needs torch, which is not installed here: {INSTALL_HINT}")


#: A line `import torch_npu` at the top level of a file: what NPU001 writes, unguarded.
_TOP_LEVEL_TORCH_NPU = re.compile(r"^(import torch_npu\b|from torch_npu\b)", re.MULTILINE)


def imports_torch_npu(tree: Path) -> bool:
    """Whether a file of the migrated tree imports torch_npu unguarded at module level (as `apply` writes
    it next to other rewrites): without torch_npu, that tree imports only on the simulated NPU host."""
    for path in tree.rglob("*.py"):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "torch_npu" in text and _TOP_LEVEL_TORCH_NPU.search(text):
            return True
    return False


def _run_pair(original: Path, migrated: Path, factory: Path, dtype: str, seed: int, mode: str, timeout):
    """Both sides at once: each is a fresh interpreter, mostly spent importing, so they overlap well."""
    import npu_migrate

    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    # The worker is imported by module name: make sure this npu_migrate is the one found.
    package_parent = str(Path(npu_migrate.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), package_parent) if p)
    with tempfile.TemporaryDirectory(prefix="npu-migrate-verify-") as tmp:
        procs = {}
        for role, tree in (("original", original), ("migrated", migrated)):
            out, log = Path(tmp, f"{role}.pt"), Path(tmp, f"{role}.log")
            cmd = [
                sys.executable,
                "-m",
                "npu_migrate.verify.worker",
                "--dir",
                str(tree.resolve()),
                "--factory",
                str(factory.resolve()),
                "--role",
                role,
                "--dtype",
                dtype,
                "--seed",
                str(seed),
                "--mode",
                mode,
                "--out",
                str(out),
            ]
            if role == "migrated" and imports_torch_npu(tree):
                cmd.append("--stand-in")
            # A file, not a pipe, takes the user's prints: a full pipe would stall the side not being read.
            with open(log, "wb") as sink:
                procs[role] = (subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT), out, log)
        results = {}
        try:
            for role, (proc, out, log) in procs.items():
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    raise VerifyUsageError(f"the {role} side did not finish within {timeout:g}s") from None
                if proc.returncode != 0 or not out.is_file():
                    tail = log.read_text(encoding="utf-8", errors="replace")[-4000:]
                    missing = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", tail)
                    if missing and missing.group(1).split(".")[0] in ("torch", "numpy"):
                        raise VerifyUsageError(
                            f"the {role} worker could not start: {missing.group(1)} is not installed: {INSTALL_HINT}",
                            tail,
                        )
                    raise VerifyUsageError(
                        f"the {role} worker exited with status {proc.returncode} without a result", tail
                    )
                results[role] = _load(out)
        finally:
            for proc, _, _ in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return results["original"], results["migrated"]


def _load(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)


def _compare_outputs(before: list, after: list, report: VerifyReport) -> None:
    names_before, names_after = [n for n, _ in before], [n for n, _ in after]
    if names_before != names_after:
        report.failures.append(f"the outputs differ in structure: original {names_before}, migrated {names_after}")
        return
    if not before:
        report.failures.append("the model returned no tensor to compare")
        return
    for (name, a), (_, b) in zip(before, after):
        out = _metrics(name, a, b)
        if out.note:
            out.passed = False
            report.failures.append(f"{name}: {out.note}")
        elif not out.cosine >= report.min_cosine:
            out.passed = False
            report.failures.append(f"{name}: cosine {out.cosine:.6f} < {report.min_cosine:g}")
        report.outputs.append(out)


def _metrics(name: str, a, b) -> OutputReport:
    import torch

    shape, dtype = list(a.shape), str(a.dtype).replace("torch.", "")
    if a.shape != b.shape:
        return OutputReport(
            name,
            shape,
            dtype,
            math.nan,
            math.nan,
            math.nan,
            None,
            False,
            f"shape {tuple(b.shape)} != original {tuple(a.shape)}",
        )
    x, y = a.double().flatten(), b.double().flatten()
    if x.numel() == 0:
        return OutputReport(name, shape, dtype, 1.0, 0.0, 0.0, None, True)
    finite = bool(torch.isfinite(y).all()) and bool(torch.isfinite(x).all())
    nx, ny = x.norm(), y.norm()
    if not finite:
        cosine = math.nan
    elif nx == 0 and ny == 0:
        cosine = 1.0
    elif nx == 0 or ny == 0:
        cosine = 0.0
    else:
        cosine = float(torch.dot(x, y) / (nx * ny))
    diff = (x - y).abs()
    max_abs = float(diff.max())
    max_rel = max_abs / max(float(x.abs().max()), 1e-30)
    top1 = None
    if name.split(".")[-1].split("[")[0].endswith("logits") and a.dim() >= 1 and a.shape[-1] > 1:
        top1 = float((a.argmax(-1) == b.argmax(-1)).double().mean())
    note = ""
    if not finite:
        side = "the migrated output" if bool(torch.isfinite(x).all()) else "the original output"
        note = f"non-finite values (NaN/inf) in {side}"
    return OutputReport(name, shape, dtype, cosine, max_abs, max_rel, top1, True, note)


def _check_fused_ran(report: VerifyReport) -> None:
    """A migrated tree whose fused branches never ran was not verified: that is a failure, not a pass."""
    if not report.modules:
        report.failures.append(
            "no migrated module with fused branches was imported: nothing was verified "
            "(is --migrated the output of `npu-migrate apply`, and does build() use it?)"
        )
        return
    if not any(report.fused_calls.values()):
        names = ", ".join(m.name for m in report.modules[:3])
        report.failures.append(
            f"the migrated code has fused branches ({names}) but none ran: the original code ran instead "
            f"(silent fallback); check the branch guards for this model and dtype"
        )
        return
    for m in report.modules:
        idle = sorted(op for op, n in m.sites.items() if n and not m.calls.get(op))
        if idle:
            report.warnings.append(f"{m.name}: {', '.join(idle)} never called (its branch guards declined)")
