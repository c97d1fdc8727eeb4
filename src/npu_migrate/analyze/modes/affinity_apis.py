"""Mode `affinity_apis`: every site where a torch_npu fused or affinity API applies.

Two sources. The fused-operator rules (NPU7xx: RMSNorm, SwiGLU) report each candidate they found,
rewritten or declined with the reason; those findings are listed as they are. The other documented
affinity APIs are matched here, on the same folded patterns a reader would recognise (torch_npu_facts.md
section 1): QuickGELU, GEGLU, softmax over a masked-filled score, rotary `x * cos + rotate_half(x) * sin`,
scaled_dot_product_attention, flash_attn's functions, and the optimizers torch_npu has fused versions of.
An affinity API the chosen torch_npu version lacks is still listed, saying so.
"""

from __future__ import annotations

import ast
import functools

from npu_migrate.analyze import rules as R
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
    walk,
)
from npu_migrate.engine.registry import rule
from npu_migrate.transforms.fused import IDIOMS


@functools.cache
def fused_rule_targets() -> dict[str, str]:
    """Rule id -> the torch_npu operator each fused-operator rule injects, as its idiom declares it."""
    return {idiom.rule.id: f"torch_npu.{idiom.kernels[0]}" for idiom in IDIOMS}


def is_fused_rule(rule_id: str) -> bool:
    return "fused" in rule(rule_id).tags


_SDPA = "torch.nn.functional.scaled_dot_product_attention"
_SOFTMAX = {"torch.softmax", "torch.nn.functional.softmax", "torch.nn.functional.log_softmax"}
_GELU = {"torch.nn.functional.gelu"}
_SIGMOID = {"torch.sigmoid", "torch.nn.functional.sigmoid"}
_OPTIMIZERS = {
    "torch.optim.AdamW": "torch_npu.optim.NpuFusedAdamW",
    "torch.optim.Adam": "torch_npu.optim.NpuFusedAdam",
    "torch.optim.SGD": "torch_npu.optim.NpuFusedSGD",
}
_FLASH_ATTN = (
    "flash_attn.flash_attn_func",
    "flash_attn.flash_attn_varlen_func",
    "flash_attn.flash_attn_qkvpacked_func",
    "flash_attn.flash_attn_interface.flash_attn_func",
)

ADVICE = {
    "torch_npu.npu_fast_gelu": "QuickGELU x*sigmoid(1.702x) is exactly torch_npu.npu_fast_gelu(x) (not F.gelu: they differ by 2e-2)",
    "torch_npu.npu_scaled_masked_softmax": "softmax over masked_fill scores is torch_npu.npu_scaled_masked_softmax(x, mask, scale) "
    "(mask True = masked; x 4-D, last two dims in [32, 4096] and divisible by 32)",
    "torch_npu.npu_rotary_mul": "rotary x*cos + rotate_half(x)*sin is torch_npu.npu_rotary_mul(x, cos, sin)",
    "torch_npu.npu_fusion_attention": "torch_npu.npu_fusion_attention is the fused attention kernel: pass scale=1/sqrt(D) "
    "(its default is 1), invert a boolean mask (True = masked on NPU), and give "
    "is_causal=True as sparse_mode=2 with the 2048x2048 triu(1) mask",
    "flash": "flash_attn is CUDA-only: torch_npu.npu_fusion_attention with input_layout 'BSND', causal=True as "
    "sparse_mode=3 (bottom-right aligned) with the 2048x2048 triu(1) mask, keep_prob=1-dropout_p",
}


def is_fused_site(finding) -> bool:
    """A fused-operator rule's finding about one candidate (not the shared helpers it adds once per file, nor
    an import it makes conditional)."""
    return is_fused_rule(finding.rule_id) and finding.data.get("fused") not in ("helpers", "import")


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _number(node: ast.AST, value: float) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and abs(node.value - value) < 1e-9


class _Matcher(Visitor):
    def __init__(self, source: Source, api, covered: frozenset[str]) -> None:
        self.source, self.api, self.covered = source, api, covered
        self.rows: list[list] = []
        self.findings = []
        self._functions: list[ast.AST] = []
        # Per enclosing function, computed on first use: most functions hold neither pattern.
        self._chunks: list[dict | None] = []  # name -> (pair partner, side)
        self._masked: list[set[str] | None] = []  # names assigned from masked_fill

    def _add(
        self,
        node: ast.AST,
        api_type: str,
        call_name: str,
        target: str,
        advice_key: str | None = None,
        note: str | None = None,
    ) -> None:
        if target in self.covered:
            return  # a fused-operator rule finds these sites and says whether it rewrote them
        line, col = self.source.pos(node)
        op = target.rsplit(".", 1)[-1]
        available = not op.startswith("npu_") or op in self.api.fused_ops
        note = note or ADVICE.get(advice_key or target, target)
        if not available:
            note += f"; torch_npu {self.api.version} does not have {op}: choose a newer --torch-npu-version"
        end = getattr(node, "end_lineno", line) or line
        self.rows.append(
            [
                f"{self.source.display}:{line}:{col}",
                end,
                api_type,
                call_name,
                target,
                "candidate" if available else "unavailable",
                R.AFFINITY_API.id,
                note,
            ]
        )
        self.findings.append(
            R.finding(R.AFFINITY_API, self.source.display, line, col, f"{call_name}: {note}", data={"api": target})
        )

    # -- scopes
    def visit_FunctionDef(self, node) -> None:
        self._functions.append(node)
        self._chunks.append(None)
        self._masked.append(None)
        if node.name == "rotate_half":
            self._add(node, "function", "rotate_half", "torch_npu.npu_rotary_mul")
        self.generic_visit(node)
        self._functions.pop()
        self._chunks.pop()
        self._masked.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    # -- patterns
    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Mult):
            if self._quick_gelu(node):
                self._add(node, "special", self.source.segment(node, 60), "torch_npu.npu_fast_gelu")
            else:
                side = self._geglu(node)
                if side is not None:
                    left = ", activate_left=True" if side == "left" else ""
                    self._add(
                        node,
                        "special",
                        self.source.segment(node, 60),
                        "torch_npu.npu_geglu",
                        note=f"GEGLU over x.chunk(2, -1) is torch_npu.npu_geglu(x, dim=-1, approximate=0{left})[0] "
                        "(approximate=0 is the erf GELU of F.gelu; the default 1 is the tanh form)",
                    )
        self.generic_visit(node)

    def _quick_gelu(self, node: ast.BinOp) -> bool:
        for x, sig in ((node.left, node.right), (node.right, node.left)):
            if isinstance(sig, ast.Call) and len(sig.args) == 1 and self.source.names.resolve(sig.func) in _SIGMOID:
                inner = sig.args[0]
                if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Mult):
                    if (_number(inner.left, 1.702) and _same(inner.right, x)) or (
                        _number(inner.right, 1.702) and _same(inner.left, x)
                    ):
                        return True
        return False

    def _geglu(self, node: ast.BinOp) -> str | None:
        """Which half GELU is applied to, when this product is a GEGLU."""
        if not self._chunks:
            return None
        if self._chunks[-1] is None:
            self._chunks[-1] = _chunk_pairs(self._functions[-1])
        pairs = self._chunks[-1]
        for value, act in ((node.left, node.right), (node.right, node.left)):
            if (
                isinstance(act, ast.Call)
                and act.args
                and self.source.names.resolve(act.func) in _GELU
                and isinstance(act.args[0], ast.Name)
                and isinstance(value, ast.Name)
            ):
                partner = pairs.get(act.args[0].id)
                if partner is not None and partner[0] == value.id:
                    return partner[1]
        return None

    def visit_Call(self, node: ast.Call) -> None:
        qualname = self.source.names.resolve(node.func)
        if qualname == _SDPA:
            self._add(node, "torch", "F.scaled_dot_product_attention", "torch_npu.npu_fusion_attention")
        elif qualname in _FLASH_ATTN or ((qualname or "").startswith("flash_attn.") and qualname.endswith("_func")):
            self._add(node, "function", qualname, "torch_npu.npu_fusion_attention", "flash")
        elif qualname in _OPTIMIZERS:
            target = _OPTIMIZERS[qualname]
            line, col = self.source.pos(node)
            note = f"{target} fuses the parameter update of {qualname} into a few kernels (same hyper-parameters)"
            self.rows.append(
                [
                    f"{self.source.display}:{line}:{col}",
                    getattr(node, "end_lineno", line),
                    "torch",
                    qualname,
                    target,
                    "candidate",
                    R.AFFINITY_API.id,
                    note,
                ]
            )
            self.findings.append(
                R.finding(R.AFFINITY_API, self.source.display, line, col, f"{qualname}: {note}", data={"api": target})
            )
        elif self._masked_softmax(node, qualname):
            self._add(node, "special", self.source.segment(node, 60), "torch_npu.npu_scaled_masked_softmax")
        self.generic_visit(node)

    def _masked_softmax(self, node: ast.Call, qualname: str | None) -> bool:
        if qualname in _SOFTMAX and node.args:
            subject = node.args[0]
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "softmax" and qualname is None:
            subject = node.func.value
        else:
            return False
        if _is_masked_fill(subject):
            return True
        if not isinstance(subject, ast.Name) or not self._masked:
            return False
        if self._masked[-1] is None:
            self._masked[-1] = _masked_names(self._functions[-1], self.source)
        return subject.id in self._masked[-1]


def _is_masked_fill(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("masked_fill", "masked_fill_")
    )


def _masked_names(function: ast.AST, source: Source) -> set[str]:
    names = set()
    for node in walk(function):
        if isinstance(node, ast.Assign) and _is_masked_fill(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "masked_fill_"
            and isinstance(node.value.func.value, ast.Name)
        ):
            names.add(node.value.func.value.id)
    return names


def _chunk_pairs(function: ast.AST) -> dict[str, tuple[str, str]]:
    """`a, b = x.chunk(2, dim=-1)`: b -> (a, "right"), a -> (b, "left")."""
    pairs = {}
    for node in walk(function):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Tuple)
            and len(node.targets[0].elts) == 2
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "chunk"
            and node.value.args
            and _number(node.value.args[0], 2)
        ):
            left, right = node.targets[0].elts
            if isinstance(left, ast.Name) and isinstance(right, ast.Name):
                pairs[right.id] = (left.id, "right")
                pairs[left.id] = (right.id, "left")
    return pairs


def scan(source: Source, context: Context) -> dict | None:
    if "torch" not in source.names.modules and not any(
        m.startswith(("torch.", "flash_attn")) for m in source.names.modules
    ):
        return None
    matcher = _Matcher(source, context.api, frozenset(fused_rule_targets().values()))
    matcher.visit(source.tree)
    if not matcher.rows:
        return None
    return {"rows": matcher.rows, "findings": matcher.findings}


def _site_line(project: Project, finding, cache: dict[str, list[str]]) -> str:
    """The line a declined finding points at (`def forward(self, x)`): it has no rewritten code to quote."""
    if finding.path not in cache:
        try:
            text = (project.root / finding.path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        cache[finding.path] = text.splitlines()
    lines = cache[finding.path]
    return lines[finding.line - 1].strip().rstrip(":") if 0 < finding.line <= len(lines) else ""


def collect(project: Project, result: ModeResult) -> None:
    rows = []
    lines: dict[str, list[str]] = {}
    for finding in project.rule_findings:
        if not is_fused_rule(finding.rule_id):
            continue
        result.findings.append(finding)
        if not is_fused_site(finding):
            continue
        target = fused_rule_targets().get(finding.rule_id, "torch_npu fused operator")
        # "native": torch_npu fuses the call as it is (SDPA), nothing to apply by hand
        status = "applied" if finding.fixed else "native" if finding.data.get("fused") == "native" else "declined"
        # api_call_name names the site's code, never the rule (which has its own column)
        name = finding.original.splitlines()[0].rstrip(":") if finding.original else _site_line(project, finding, lines)
        rows.append(
            [finding.location(), finding.line, "function", name, target, status, finding.rule_id, finding.message]
        )
    for _, facts in project.facts("affinity_apis"):
        rows.extend(facts["rows"])
        result.findings.extend(facts["findings"])
    rows.sort(key=lambda r: location_key(r[0]))
    result.findings.sort(key=finding_key)
    result.tables = [
        Table(
            "affinity_api_call.csv",
            "Affinity API sites",
            ["location", "end_line", "api_type", "api_call_name", "affinity_api", "status", "rule", "reason"],
            rows,
        )
    ]
    by_status: dict[str, int] = {}
    for row in rows:
        by_status[row[5]] = by_status.get(row[5], 0) + 1
    result.summary = [
        f"{len(rows)} affinity API sites: " + (", ".join(f"{k} {v}" for k, v in sorted(by_status.items())) or "none")
    ]
    result.data = {"sites": [dict(zip(result.tables[0].header, row)) for row in rows], "by_status": by_status}
    _levers(project, result)


#: `training_levers.csv`: one row per site of a training speed lever (rules tagged "lever").
LEVER_HEADER = ["location", "lever", "rule", "status", "reason"]


def lever_status(finding, selected: bool) -> str:
    """applied (apply rewrites it), available (an opt-in lever not selected: `--select` it), declined (the
    rule looked and left it: the reason is the message), or advice (a report-only lever)."""
    if not rule(finding.rule_id).fixable:
        return "advice"
    if not finding.fixed:
        return "declined"
    return "applied" if selected else "available"


def _levers(project: Project, result: ModeResult) -> None:
    """The training speed levers, selected ones from the report's findings and opt-in ones from their own run."""
    found = [(f, True) for f in project.rule_findings if "lever" in rule(f.rule_id).tags]
    found += [(f, False) for _, facts in project.facts("levers") for f in facts["opt_in"]]
    rows = []
    for finding, selected in sorted(found, key=lambda item: (location_key(item[0].location()), item[0].rule_id)):
        status = lever_status(finding, selected)
        reason = finding.message + (f" (opt-in: `--select ALL,{finding.rule_id}`)" if status == "available" else "")
        rows.append([finding.location(), rule(finding.rule_id).name, finding.rule_id, status, reason])
    if not rows:
        return
    result.tables.append(Table("training_levers.csv", "Training speed levers", LEVER_HEADER, rows))
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[3]] = counts.get(row[3], 0) + 1
    result.summary.append(
        f"{len(rows)} training lever sites: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    result.data["levers"] = [dict(zip(LEVER_HEADER, row)) for row in rows]


MODE = Mode("affinity_apis", "Affinity APIs", scan=scan, collect=collect)
