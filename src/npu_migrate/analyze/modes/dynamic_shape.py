"""Mode `dynamic_shape`: where tensor shapes depend on the data, found statically and measured.

Ascend compiles an operator for each input shape it meets, so a shape that changes with the data costs
a compilation (and the operators that produce it a device-to-host sync). Found statically:

* operators whose output size depends on values: `nonzero`, `argwhere`, `unique`,
  `unique_consecutive`, `masked_select`, one-argument `torch.where`, `repeat_interleave` with tensor
  repeats, and boolean-mask indexing `x[mask]` (a comparison, or a name bound to one);
* collate functions that pad each batch to its longest sample (`pad_sequence`, `max(len(...))`);
* `if` / `while` on a shape inside a `forward` method.

`--instrument OUT` writes a copy of the tree in which each operator site above is wrapped in a recorder
(with libcst, so the rest of the code is byte-identical). Running the copy writes
`npu_migrate_shapes.csv`: per site, the calls seen, the distinct output shapes and their range, so the
shapes worth bucketing are measured, not guessed; no hand edit of the copy is needed.
"""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

from npu_migrate.analyze import rules as R
from npu_migrate.analyze.project import (
    AnalysisError,
    Context,
    Mode,
    ModeResult,
    Project,
    Source,
    Table,
    Visitor,
    finding_key,
    walk,
)
from npu_migrate.files.source import SourceError, read_source

DATA_DEPENDENT = ("nonzero", "argwhere", "unique", "unique_consecutive", "masked_select")
RECORDER_MODULE = "_npu_migrate_shapes"
RECORDER_NAME = "__npu_migrate_shape__"
SHAPES_CSV = "npu_migrate_shapes.csv"


def _bool_expr(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
        return _bool_expr(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
        return _bool_expr(node.left) or _bool_expr(node.right)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr
        in (
            "bool",
            "isnan",
            "isinf",
            "isfinite",
            "logical_not",
            "logical_and",
            "logical_or",
            "eq",
            "ne",
            "gt",
            "lt",
            "ge",
            "le",
        )
    )


class _Finder(Visitor):
    def __init__(self, source: Source) -> None:
        self.source = source
        self.sites: list[list] = []  # [line, col, end_line, end_col, api, kind]
        self.findings = []
        self._masks: list[set[str] | None] = [set()]  # per function, computed on first use
        self._scopes: list[ast.AST] = [source.tree]
        self._functions: list[str] = []
        self._collate_args: set[str] = set()

    def _site(self, node: ast.AST, api: str, kind: str, message: str, rule=R.DYNAMIC_SHAPE) -> None:
        line, col = self.source.pos(node)
        self.sites.append([line, col, api, kind])
        self.findings.append(R.finding(rule, self.source.display, line, col, message))

    def visit_Module(self, node: ast.Module) -> None:
        if "collate_fn" in self.source.text:
            for call in walk(node):
                if isinstance(call, ast.Call):
                    for keyword in call.keywords:
                        if keyword.arg == "collate_fn" and isinstance(keyword.value, (ast.Name, ast.Attribute)):
                            value = keyword.value
                            self._collate_args.add(value.id if isinstance(value, ast.Name) else value.attr)
        self.generic_visit(node)

    def _mask_names(self) -> set[str]:
        if self._masks[-1] is None:
            self._masks[-1] = {
                t.id
                for child in walk(self._scopes[-1])
                if isinstance(child, ast.Assign) and _bool_expr(child.value)
                for t in child.targets
                if isinstance(t, ast.Name)
            }
        return self._masks[-1]

    def visit_FunctionDef(self, node) -> None:
        self._masks.append(None)
        self._scopes.append(node)
        self._functions.append(node.name)
        if "collate" in node.name.lower() or node.name in self._collate_args:
            self._collate(node)
        self.generic_visit(node)
        self._functions.pop()
        self._masks.pop()
        self._scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _collate(self, node) -> None:
        for child in walk(node):
            name = None
            if isinstance(child, ast.Call):
                qualname = self.source.names.resolve(child.func) or ""
                if qualname.endswith("pad_sequence"):
                    name = "pad_sequence"
                elif (
                    isinstance(child.func, ast.Name)
                    and child.func.id == "max"
                    and any(
                        isinstance(a, (ast.GeneratorExp, ast.ListComp))
                        and "len(" in self.source.segment(a, 400)
                        or isinstance(a, ast.Call)
                        and getattr(a.func, "id", None) == "len"
                        for a in child.args
                    )
                ):
                    name = "max(len(...))"
            if name is not None:
                self._site(
                    node,
                    "collate_fn",
                    "collate",
                    f"collate function {node.name} pads each batch to its longest sample ({name}): every "
                    "batch gets a new shape and a new operator compilation on NPU; pad to a fixed length "
                    "or a few buckets",
                    R.VARIABLE_SHAPE_INPUT,
                )
                return

    def visit_If(self, node) -> None:
        if self._functions and self._functions[-1] == "forward":
            text = self.source.segment(node.test, 200)
            if ".shape" in text or ".size(" in text or ".dim()" in text or ".numel()" in text:
                self._site(
                    node,
                    "if " + text,
                    "control_flow",
                    f"control flow on a shape in forward ({text}): each shape takes its own path; on NPU "
                    "keep shapes static so one compiled graph serves every step",
                    R.VARIABLE_SHAPE_INPUT,
                )
        self.generic_visit(node)

    visit_While = visit_If

    def visit_Call(self, node: ast.Call) -> None:
        qualname = self.source.names.resolve(node.func)
        api = None
        if qualname is not None and qualname.startswith("torch."):
            if qualname in (f"torch.{n}" for n in DATA_DEPENDENT):
                api = qualname
            elif qualname == "torch.where" and len(node.args) == 1 and not node.keywords:
                api = "torch.where (one argument)"
            elif (
                qualname == "torch.repeat_interleave"
                and len(node.args) > 1
                and not isinstance(node.args[1], ast.Constant)
            ):
                api = "torch.repeat_interleave (tensor repeats)"
        elif qualname is None and isinstance(node.func, ast.Attribute) and node.func.attr in DATA_DEPENDENT:
            if node.func.attr != "unique" or not isinstance(node.func.value, (ast.List, ast.Set)):
                api = f"Tensor.{node.func.attr}"
        if api is not None:
            self._site(
                node,
                api,
                "operator",
                f"{api}: the output shape depends on the data (a device-to-host sync, "
                "and a compilation per new shape on NPU)",
            )
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            index = node.slice
            if _bool_expr(index) or (isinstance(index, ast.Name) and index.id in self._mask_names()):
                text = self.source.segment(node, 60)
                self._site(
                    node,
                    "boolean mask index",
                    "mask_index",
                    f"boolean-mask indexing {text}: the result's size is the number of True values; "
                    "torch.where(mask, x, 0) or masked_fill keep the shape static",
                )
        self.generic_visit(node)


def scan(source: Source, context: Context) -> dict | None:
    if "torch" not in source.text:
        return None
    finder = _Finder(source)
    finder.visit(source.tree)
    if not finder.sites:
        return None
    return {"sites": finder.sites, "findings": finder.findings}


def collect(project: Project, result: ModeResult) -> None:
    rows = []
    for scan_, facts in project.facts("dynamic_shape"):
        result.findings.extend(facts["findings"])
        for line, col, api, kind in facts["sites"]:
            rows.append([f"{scan_.display}:{line}:{col}", kind, api])
    result.findings.sort(key=finding_key)
    result.tables = [Table("dynamic_shape.csv", "Sources of dynamic shapes", ["location", "kind", "api"], rows)]
    kinds: dict[str, int] = {}
    for row in rows:
        kinds[row[1]] = kinds.get(row[1], 0) + 1
    result.summary = [
        f"{len(rows)} dynamic-shape sources: " + (", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none")
    ]
    result.data = {"sites": [dict(zip(result.tables[0].header, r)) for r in rows], "by_kind": kinds}


# --- instrumentation ---------------------------------------------------------------------------------


def instrument(project: Project, out: Path) -> list[str]:
    """Write the instrumented copy of the analysed tree into `out`; returns the files instrumented."""
    import libcst as cst

    from npu_migrate.engine.templating import render
    from npu_migrate.files.discovery import is_skipped_dir

    root = project.root
    out = out.resolve()
    if out == root or root in out.parents:
        raise AnalysisError(f"--instrument {out} is inside the analysed tree {root}; choose a folder outside it")
    sites: dict[str, list] = {}
    for scan_, facts in project.facts("dynamic_shape"):
        wanted = [s for s in facts["sites"] if s[3] in ("operator", "mask_index")]
        if wanted:
            sites[scan_.display] = wanted
    try:
        out.mkdir(parents=True, exist_ok=True)
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            folder = Path(dirpath)
            dirnames[:] = sorted(
                d for d in dirnames if not is_skipped_dir(folder / d) and (folder / d).resolve() != out
            )
            for name in filenames:
                src = folder / name
                if src.is_symlink():
                    continue
                rel = src.relative_to(root).as_posix()
                dst = out / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                if rel in sites:
                    prelude = render(
                        "report/shape_prelude.py.j2",
                        depth=rel.count("/"),
                        module=RECORDER_MODULE,
                        recorder=RECORDER_NAME,
                    )
                    try:
                        code = _instrument_text(cst, read_source(src).text, rel, sites[rel], prelude)
                    except (SourceError, cst.ParserSyntaxError) as exc:
                        raise AnalysisError(f"{rel}: cannot instrument: {exc}") from None
                    dst.write_text(code, encoding="utf-8")
                else:
                    shutil.copy2(src, dst)
        (out / f"{RECORDER_MODULE}.py").write_text(
            render("report/shape_recorder.py.j2", csv_name=SHAPES_CSV), encoding="utf-8"
        )
    except OSError as exc:
        raise AnalysisError(f"--instrument {out}: {exc.strerror or exc} ({getattr(exc, 'filename', '')})") from None
    return sorted(sites)


def _instrument_text(cst, text: str, display: str, sites: list, prelude: str) -> str:
    from libcst.metadata import MetadataWrapper, PositionProvider

    from npu_migrate.program.imports import insertion_index

    module = cst.parse_module(text)
    wrapper = MetadataWrapper(module)
    positions = wrapper.resolve(PositionProvider)
    wanted = {(line, col - 1): api for line, col, api, _ in sites}

    class Wrap(cst.CSTTransformer):
        def _wrap(self, original, updated):
            pos = positions.get(original)
            if pos is None:
                return updated
            api = wanted.pop((pos.start.line, pos.start.column), None)
            if api is None:
                return updated
            site = f"{display}:{pos.start.line}:{pos.start.column + 1}"
            return cst.Call(
                func=cst.Name(RECORDER_NAME),
                args=[cst.Arg(cst.SimpleString(repr(site))), cst.Arg(cst.SimpleString(repr(api))), cst.Arg(updated)],
            )

        def leave_Call(self, original, updated):
            return self._wrap(original, updated)

        def leave_Subscript(self, original, updated):
            return self._wrap(original, updated)

    new = wrapper.module.visit(Wrap())
    body = list(new.body)
    index = insertion_index(new)
    body[index:index] = list(cst.parse_module(prelude).body)
    return new.with_changes(body=body).code


MODE = Mode("dynamic_shape", "Dynamic shapes", scan=scan, collect=collect)
