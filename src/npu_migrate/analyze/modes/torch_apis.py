"""Mode `torch_apis`: every torch / torch.cuda / torch_npu API a file uses, and whether the chosen
torch_npu version supports it.

The verdicts come from the generated per-version tables (`NpuApi`, the same object the NPU2xx rules
consult), never from a list kept here: `torch.cuda.X` is supported when the version has `torch.npu.X`
or a rename, unsupported when the tables say it has no counterpart, unknown when it is not a torch.cuda
name at all. Device-agnostic torch APIs (`torch.matmul`, `torch.nn.Linear`) dispatch to torch_npu
through PyTorch's PrivateUse1 backend and count as supported, unless a rule reports an error at the very
site (`nn.DataParallel`, NPU305), in which case the rule's verdict is the API's.
"""

from __future__ import annotations

import ast
from collections import Counter

from npu_migrate.analyze import rules as R
from npu_migrate.analyze.modes.affinity_apis import is_fused_rule, is_fused_site
from npu_migrate.analyze.modes.custom_kernels import is_kernel_rule
from npu_migrate.analyze.project import (
    Context,
    Mode,
    ModeResult,
    Project,
    Source,
    Table,
    Visitor,
    finding_key,
    location_key,
)
from npu_migrate.engine.registry import rules_tagged
from npu_migrate.findings import Finding, Severity
from npu_migrate.program.api import Kind

SUPPORTED, UNSUPPORTED, UNKNOWN = "supported", "unsupported", "unknown"

#: Rule findings that are advice about numerics, and those about speed (the two advice CSVs).
#: The rules behind api_precision_advice.csv and api_performance_advice.csv (and every fused-operator site).
PRECISION_RULES = frozenset(r.id for r in rules_tagged("precision"))
PERFORMANCE_RULES = frozenset(r.id for r in rules_tagged("performance"))

#: Roots whose names this mode lists: torch itself and torch_npu.
ROOTS = ("torch", "torch_npu")

_FLOAT64 = {"torch.float64", "torch.double"}
_GELU = {"torch.nn.functional.gelu", "torch.nn.GELU"}


def classify(qualname: str, api) -> tuple[str, str, str]:
    """(status, NPU equivalent, advice) of one API for this torch_npu version."""
    parts = qualname.split(".")
    version = api.version
    if parts[:2] == ["torch", "cuda"]:
        if len(parts) > 2 and parts[2] == "amp":
            if len(parts) == 3:
                return SUPPORTED, "torch.amp", ""
            if parts[3] in api.npu_amp:
                return SUPPORTED, f"torch.amp.{parts[3]} (device_type='npu')", ""
            return UNSUPPORTED, "", f"torch.cuda.amp.{parts[3]} has no counterpart in torch_npu {version}."
        mapping = api.map_cuda(qualname)
        if mapping.kind in (Kind.SAME, Kind.RENAMED):
            return SUPPORTED, mapping.target or "", ""
        if mapping.kind is Kind.CAVEAT:
            return SUPPORTED, "torch.npu." + ".".join(parts[2:]), mapping.advice
        if mapping.kind is Kind.MISSING:
            return UNSUPPORTED, "", mapping.advice
        if mapping.kind is Kind.OWNED:
            return SUPPORTED, "", ""
        return UNKNOWN, "", mapping.advice
    if parts[:2] == ["torch", "npu"] or parts[:2] == ["torch_npu", "npu"]:
        if len(parts) == 2 or api.has_npu(parts[2]):
            return SUPPORTED, qualname, ""
        return UNSUPPORTED, "", f"{qualname} does not exist in torch_npu {version}."
    if parts[0] == "torch_npu":
        if len(parts) == 1 or parts[1] in api.fused_ops:
            return SUPPORTED, qualname, ""
        if parts[1].startswith("npu_"):
            return UNSUPPORTED, "", f"torch_npu {version} has no operator {parts[1]}."
        return UNKNOWN, "", f"{qualname} is not in the generated torch_npu {version} tables; check it by hand."
    if parts[:3] in (["torch", "backends", "cuda"], ["torch", "backends", "cudnn"]):
        return (
            UNKNOWN,
            "",
            (
                f"{qualname}: the CUDA backend settings are not part of the torch_npu API tables; "
                "most are host-side flags without effect on NPU, check this one by hand."
            ),
        )
    if parts[:3] == ["torch", "utils", "cpp_extension"]:
        return UNKNOWN, "", "torch.utils.cpp_extension builds native code: see the custom_kernels mode."
    return SUPPORTED, qualname, ""


class _Uses(Visitor):
    """Every outermost Name/Attribute chain that resolves to torch or torch_npu, plus CUDA method calls."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.uses: list[tuple[str, int, int]] = []
        self.cuda_methods: list[tuple[str, int, int]] = []
        self.advice: list[Finding] = []

    def _record(self, node: ast.AST) -> bool:
        qualname = self.source.names.resolve(node)
        if qualname is None:
            return False
        if qualname.split(".")[0] in ROOTS:
            line, col = self.source.pos(node)
            self.uses.append((qualname, line, col))
            self._advise(qualname, node)
        return True

    def _advise(self, qualname: str, node: ast.AST) -> None:
        line, col = self.source.pos(node)
        if qualname in _FLOAT64:
            self.advice.append(
                R.finding(
                    R.FLOAT64,
                    self.source.display,
                    line,
                    col,
                    f"{qualname}: most NPU kernels have no float64 implementation; use float32 "
                    "or keep this computation on the CPU",
                )
            )
        elif qualname in _GELU:
            self.advice.append(
                R.finding(
                    R.GELU_APPROXIMATE,
                    self.source.display,
                    line,
                    col,
                    f"{qualname} runs the tanh approximation on NPU whatever `approximate` says; "
                    'use torch_npu.npu_gelu(x, approximate="none") where exact GELU matters',
                )
            )

    def visit_Name(self, node: ast.Name) -> None:
        self._record(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if (
            isinstance(node.ctx, ast.Load)
            and node.attr in ("cuda", "is_cuda")
            and self.source.names.resolve(node) is None
        ):
            line, col = self.source.pos(node)
            self.cuda_methods.append(("Tensor.cuda" if node.attr == "cuda" else "Tensor.is_cuda", line, col))
        if not self._record(node):
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "double" and not node.args and not node.keywords:
            line, col = self.source.pos(node)
            self.advice.append(
                R.finding(
                    R.FLOAT64,
                    self.source.display,
                    line,
                    col,
                    f"{self.source.segment(func)}(): most NPU kernels have no float64 "
                    "implementation; use float32 or keep this computation on the CPU",
                )
            )
        self.generic_visit(node)


def scan(source: Source, context: Context) -> dict | None:
    if not any(
        root in source.names.modules or any(m.startswith(root + ".") for m in source.names.modules) for root in ROOTS
    ):
        return None
    visitor = _Uses(source)
    visitor.visit(source.tree)
    if not (visitor.uses or visitor.cuda_methods):
        return None
    return {"uses": visitor.uses, "cuda_methods": visitor.cuda_methods, "findings": visitor.advice}


def _rule_verdicts(project: Project) -> dict[tuple[str, int, int], Finding]:
    """What a rule says at a site overrules the tables: an error it cannot fix makes the API unsupported
    (NPU305 DataParallel), a rewrite makes it supported (NPU501 `allow_tf32` -> `allow_hf32`)."""
    return {(f.path, f.line, f.col): f for f in project.rule_findings if f.fixed or f.severity is Severity.ERROR}


def collect(project: Project, result: ModeResult) -> None:
    api = project.context.api
    verdicts = _rule_verdicts(project)

    # Fused-operator sites are the affinity mode's, CUDA sources and builds the custom_kernels mode's.
    result.findings = [
        f for f in project.rule_findings if not is_fused_rule(f.rule_id) and not is_kernel_rule(f.rule_id)
    ]
    unsupported, unknown, cuda_rows = [], [], []
    inventory: dict[str, dict] = {}
    counts: Counter = Counter()
    cache: dict[str, tuple[str, str, str]] = {}
    for scan, facts in project.facts("torch_apis"):
        result.findings.extend(facts["findings"])
        for qualname, line, col in facts["uses"]:
            if qualname not in cache:
                cache[qualname] = classify(qualname, api)
            status, target, advice = cache[qualname]
            verdict = verdicts.get((scan.display, line, col))
            if verdict is not None and verdict.fixed and status == UNKNOWN:
                status, target, advice = (
                    SUPPORTED,
                    verdict.replacement or target,
                    f"{verdict.rule_id}: {verdict.message}",
                )
            elif verdict is not None and not verdict.fixed and status == SUPPORTED:
                status, advice = UNSUPPORTED, f"{verdict.rule_id}: {verdict.message}"
            location = f"{scan.display}:{line}:{col}"
            counts[status] += 1
            entry = inventory.setdefault(
                qualname,
                {"api": qualname, "status": status, "npu": target, "count": 0, "first": location, "advice": advice},
            )
            entry["count"] += 1
            if status == UNSUPPORTED:
                unsupported.append([location, qualname, api.version, advice])
            elif status == UNKNOWN:
                unknown.append([location, qualname, api.version, advice])
            if qualname.startswith(("torch.cuda", "torch.backends.cuda", "torch.backends.cudnn")):
                cuda_rows.append([location, qualname, status, target, advice])
        for name, line, col in facts["cuda_methods"]:
            cuda_rows.append(
                [
                    f"{scan.display}:{line}:{col}",
                    name,
                    SUPPORTED,
                    "Tensor.npu" if name == "Tensor.cuda" else "Tensor.is_npu",
                    "",
                ]
            )
    cuda_rows.sort(key=lambda r: location_key(r[0]))
    precision = [f for f in result.findings if f.rule_id in PRECISION_RULES]
    performance = [
        f
        for scan in project.files
        for f in (*scan.findings, *scan.scanner_findings)  # performance advice gathers from every mode
        if f.rule_id in PERFORMANCE_RULES or is_fused_site(f)
    ]
    result.findings.sort(key=finding_key)
    loc_header = ["location", "api", "torch_npu_version", "reason"]
    result.tables = [
        Table("unsupported_api.csv", "Unsupported APIs", loc_header, unsupported),
        Table("unknown_api.csv", "APIs of unknown support", loc_header, unknown),
        Table(
            "cuda_op_list.csv", "CUDA APIs used", ["location", "api", "status", "npu_equivalent", "advice"], cuda_rows
        ),
        Table(
            "api_precision_advice.csv",
            "Precision advice",
            ["location", "rule", "advice"],
            [[f.location(), f.rule_id, f.message] for f in precision],
        ),
        Table(
            "api_performance_advice.csv",
            "Performance advice",
            ["location", "rule", "advice"],
            [[f.location(), f.rule_id, f.message] for f in sorted(performance, key=finding_key)],
        ),
        Table(
            "torch_api_list.csv",
            "Every torch API used",
            ["api", "status", "npu_equivalent", "uses", "first_location", "advice"],
            [
                [e["api"], e["status"], e["npu"], e["count"], e["first"], e["advice"]]
                for e in sorted(inventory.values(), key=lambda e: (-e["count"], e["api"]))
            ],
            routine=_runs_as_is,
        ),
    ]
    distinct = Counter(e["status"] for e in inventory.values())
    result.summary = [
        f"{len(inventory)} distinct torch APIs in {sum(counts.values())} uses (torch_npu {api.version}): "
        f"{distinct[SUPPORTED]} supported, {distinct[UNSUPPORTED]} unsupported, {distinct[UNKNOWN]} unknown",
        f"{len(cuda_rows)} CUDA API uses; {len(precision)} precision and {len(performance)} performance advice",
    ]
    result.data = {
        "torch_npu_version": api.version,
        "apis": sorted(inventory.values(), key=lambda e: e["api"]),
        "uses_by_status": dict(sorted(counts.items())),
    }


def _runs_as_is(row: list) -> bool:
    """A torch_api_list.csv row of an API that needs nothing: supported under its own name, no advice."""
    api, status, npu, _, _, advice = row
    return status == SUPPORTED and npu in ("", api) and not advice


MODE = Mode("torch_apis", "Torch APIs", scan=scan, collect=collect)
