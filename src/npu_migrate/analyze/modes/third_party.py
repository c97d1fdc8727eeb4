"""Mode `third_party`: CUDA-only packages the code imports, and library functions that cannot run on NPU.

Two analyses, as in Huawei's PyTorch Analyse (and what it misses: it never flagged `import flash_attn`):

* every import of a package listed in `transforms/data/third_party.toml` (flash_attn, apex, xformers,
  bitsandbytes, triton, deepspeed.ops, pynvml, ...) is reported with its Ascend alternative (NPU901);
* for a library source tree (`--env-path`), each function is unsupported when its body uses an
  unsupported torch API (the torch_apis verdicts), a CUDA-only package, a custom operator
  (`torch.ops.<namespace>` outside PyTorch's own) or a CUDA extension the library builds, and so is every
  library function that calls it, transitively through the library's static call graph. The result is
  `full_unsupported_results.csv`; `--api-files` feeds it back so the user's calls into those functions
  are reported (NPU902) without analysing the library again.

The call graph is static and intra-library: calls through the library's imports (relative ones
included), module-level names, `self.method()`, and `Class(...)` (a class is unsupported when its
`__init__`, `forward` or `__call__` is). Calls through variables of unknown type are not followed.
"""

from __future__ import annotations

import ast
import csv
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from npu_migrate.analyze import rules as R
from npu_migrate.analyze.modes.torch_apis import UNSUPPORTED, classify
from npu_migrate.analyze.project import (
    WORKER_DIED,
    AnalysisError,
    Context,
    Mode,
    ModeResult,
    Project,
    Source,
    Table,
    Visitor,
    module_name,
    parse,
    relative,
    walk,
)
from npu_migrate.engine import runner
from npu_migrate.files.discovery import discover
from npu_migrate.files.source import SourceError
from npu_migrate.program.api import cuda_package, package_table
from npu_migrate.transforms.fused.flash_attn import DECLINED, FLASH_ATTN, QUALIFIED
from npu_migrate.transforms.fused.xformers_attn import QUALIFIED as XFORMERS_QUALIFIED
from npu_migrate.transforms.fused.xformers_attn import XFORMERS_ATTENTION

API_FILE_HEADER = ["function", "kind", "location", "reason", "via"]

#: torch.ops namespaces PyTorch itself registers; any other namespace is a compiled extension's operator.
TORCH_OP_NAMESPACES = frozenset(
    {
        "aten",
        "prims",
        "quantized",
        "_c10d_functional",
        "c10d_functional",
        "c10d",
        "profiler",
        "_quantized",
        "rngprims",
        "higher_order",
        "inductor",
        "mkldnn",
        "_inductor_test",
        "npu",
    }
)
_ENTRY_METHODS = ("__init__", "forward", "__call__")


# --- the user's code ----------------------------------------------------------------------------------


def scan(source: Source, context: Context) -> dict | None:
    table = package_table()
    findings, packages = [], []
    for module, node in source.names.imports:
        names = [module]
        if isinstance(node, ast.ImportFrom):
            names = [f"{module}.{alias.name}" for alias in node.names if alias.name != "*"] or [module]
        for name in names:
            hit = cuda_package(name, table)
            if hit is None:
                continue
            prefix, entry = hit
            line, col = source.pos(node)
            advice = _advice(name, entry)
            packages.append([f"{source.display}:{line}:{col}", name, prefix, entry["alternative"], advice])
            findings.append(R.finding(R.CUDA_ONLY_PACKAGE, source.display, line, col, f"{name}: {advice}"))
    calls = []
    if context.library_unsupported:
        for node in walk(source.tree):
            if isinstance(node, ast.Call):
                qualname = source.names.resolve(node.func)
                if qualname is not None and qualname in context.library_unsupported:
                    line, col = source.pos(node)
                    why = context.library_unsupported[qualname]
                    calls.append([f"{source.display}:{line}:{col}", qualname, why])
                    findings.append(
                        R.finding(
                            R.UNSUPPORTED_LIBRARY_CALL,
                            source.display,
                            line,
                            col,
                            f"{qualname} is unsupported on NPU: {why}",
                        )
                    )
    if not findings:
        return None
    return {"findings": findings, "packages": packages, "calls": calls}


def _advice(name: str, entry: dict) -> str:
    """The package's advice; for a flash-attn or xformers function `apply` wraps, what apply does and what it
    leaves."""
    if name in XFORMERS_QUALIFIED:
        return (
            f"`npu-migrate apply` wraps its calls ({XFORMERS_ATTENTION.id}): on NPU tensors they run "
            "torch_npu.npu_fusion_attention, elsewhere the function as before, where the bias is built in the call "
            "(None, LowerTriangularMask(), LowerTriangularFromBottomRightMask(), a BlockDiagonal mask's "
            "from_seqlens); it makes this import conditional where the wrapped calls are all that use it. "
            f"A call it does not rewrite (it says why: a bias built elsewhere, `op=`) needs a hand port: "
            f"{entry['advice']}"
        )
    if name not in QUALIFIED:
        return entry["advice"]
    declined = ", ".join(f"`{argument}`" for argument in DECLINED)
    return (
        f"`npu-migrate apply` wraps its calls ({FLASH_ATTN.id}): on NPU tensors they run "
        "torch_npu.npu_fusion_attention, elsewhere the function as before; it makes this import conditional where "
        "the wrapped calls are all that use it (flash_attn does not install on NPU) and reports it otherwise. "
        f"A call it does not rewrite (it says why: one passing {declined}, say) needs a hand port: {entry['advice']}"
    )


def collect(project: Project, result: ModeResult) -> None:
    packages, calls = [], []
    for _, facts in project.facts("third_party"):
        result.findings.extend(facts["findings"])
        packages.extend(facts["packages"])
        calls.extend(facts["calls"])
    library = project.context.library_rows
    result.tables = [
        Table(
            "cuda_only_packages.csv",
            "CUDA-only packages imported",
            ["location", "import", "package", "ascend_alternative", "advice"],
            packages,
        ),
        Table(
            "unsupported_library_calls.csv",
            "Calls into unsupported library functions",
            ["location", "function", "reason"],
            calls,
        ),
    ]
    if project.settings.env_paths:
        result.tables.append(
            Table("full_unsupported_results.csv", "Unsupported library functions", API_FILE_HEADER, library)
        )
    distinct = sorted({row[2] for row in packages})
    result.summary = [
        f"{len(packages)} imports of CUDA-only packages ({', '.join(distinct) or 'none'}); "
        f"{len(calls)} calls into unsupported library functions",
    ]
    if project.settings.env_paths:
        result.summary.append(
            f"library analysis ({', '.join(p.as_posix() for p in project.settings.env_paths)}): "
            f"{sum(1 for r in library if r[1] != 'alias')} unsupported functions and classes"
        )
    result.data = {"packages": packages, "calls": calls, "library_unsupported": len(library)}


# --- a library tree -------------------------------------------------------------------------------------


@dataclass
class LibFunction:
    qualname: str
    location: str
    kind: str  # "function" or "class"
    apis: set[str] = field(default_factory=set)  # torch names its body uses
    direct: list[str] = field(default_factory=list)  # reasons found in its own body
    calls: set[str] = field(default_factory=set)  # resolved qualified names it calls


@dataclass
class LibFile:
    functions: list[LibFunction] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # module.name -> what the import binds
    extensions: set[str] = field(default_factory=set)  # CUDAExtension module names built by a setup.py
    error: str = ""


@dataclass(frozen=True)
class LibTask:
    path: Path
    display: str
    module: str | None


class _Body(Visitor):
    """Collects what one function body uses and calls."""

    def __init__(self, source: Source, module: str, owner: str | None, local: set[str], table: dict) -> None:
        self.source, self.module, self.owner, self.local, self.table = source, module, owner, local, table
        self.fn: LibFunction | None = None

    def run(self, fn: LibFunction, node: ast.AST) -> None:
        self.fn = fn
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def _name(self, node: ast.AST) -> None:
        qualname = self.source.names.resolve(node)
        if qualname is None:
            return
        root = qualname.split(".")[0]
        if root == "torch":
            parts = qualname.split(".")
            if parts[1:2] == ["ops"] and len(parts) > 3 and parts[2] not in TORCH_OP_NAMESPACES:
                self.fn.direct.append(f"calls the custom operator {'.'.join(parts[:4])} (a compiled extension)")
            else:
                self.fn.apis.add(qualname)
        hit = cuda_package(qualname, self.table)
        if hit is not None:
            self.fn.direct.append(f"uses {hit[0]} ({hit[1]['summary']}, CUDA-only)")

    def visit_Name(self, node: ast.Name) -> None:
        self._name(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self.source.names.resolve(node) is not None:
            self._name(node)
        else:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        target = None
        if isinstance(func, ast.Name) and func.id in self.local:
            target = f"{self.module}.{func.id}"
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and self.owner is not None
        ):
            target = f"{self.owner}.{func.attr}"
        else:
            target = self.source.names.resolve(func)
        if target is not None:
            self.fn.calls.add(target)
        self.generic_visit(node)


def _extension_names(tree: ast.Module) -> set[str]:
    """Module names of `CUDAExtension("pkg._ext", ...)` in a setup.py."""
    names = set()
    for node in walk(tree):
        if isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if callee == "CUDAExtension":
                arg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
    return names


def scan_library_file(task: LibTask, context: Context) -> LibFile:
    out = LibFile()
    try:
        source = parse(task.path, task.display, task.module)
    except SourceError as exc:
        out.error = str(exc)
        return out
    out.extensions = _extension_names(source.tree)
    if task.module is None:
        return out
    table = package_table()
    module = task.module
    local = {n.name for n in source.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in source.tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    continue
                local_name = alias.asname or alias.name.split(".")[0]
                target = source.names.bindings.get(local_name)
                if target is not None:
                    out.aliases[f"{module}.{local_name}"] = target
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = LibFunction(f"{module}.{node.name}", source.where(node), "function")
            _Body(source, module, None, local, table).run(fn, node)
            out.functions.append(fn)
        elif isinstance(node, ast.ClassDef):
            cls = f"{module}.{node.name}"
            out.functions.append(
                LibFunction(cls, source.where(node), "class", calls={f"{cls}.{m}" for m in _ENTRY_METHODS})
            )
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    fn = LibFunction(f"{cls}.{item.name}", source.where(item), "function")
                    _Body(source, module, cls, local, table).run(fn, item)
                    out.functions.append(fn)
    return out


def _not_scanned(task: LibTask) -> LibFile:
    return LibFile(error=WORKER_DIED)


def _library_files(env: Path) -> tuple[Path, list[Path]]:
    """The folder module names are relative to, and the Python files of one --env-path."""
    base = env.parent if (env / "__init__.py").is_file() else env
    found = discover([env], lambda p: p.suffix == ".py", respect_gitignore=False)
    # An --env-path is site-packages or a library folder: the walk must not skip it by name.
    if not found.files and env.is_dir():
        found.files = sorted(p for p in env.rglob("*.py") if not p.is_symlink())
    return base.resolve(), found.files


def prepare(context: Context) -> None:
    """The verdicts the scanners need: every --env-path library analysed, every --api-files CSV read."""
    if context.settings.env_paths:
        context.library_unsupported.update(library_unsupported(context))
    for csv_path in context.settings.api_files:
        context.library_unsupported.update(read_api_file(csv_path))


def library_unsupported(context: Context) -> dict[str, str]:
    """Analyse every --env-path; fills `context.library_rows` and returns qualified name -> reason."""
    tasks = []
    for env in context.settings.env_paths:
        base, files = _library_files(env)
        for path in files:
            display = relative(path, base)
            tasks.append(LibTask(path, display, module_name(display)))
    files = list(
        runner.run_each(scan_library_file, tasks, context, crashed=_not_scanned, workers=context.settings.jobs)
    )
    functions: dict[str, LibFunction] = {}
    aliases: dict[str, str] = {}
    extensions: set[str] = set()
    for lib in files:
        for fn in lib.functions:
            functions[fn.qualname] = fn
        aliases.update(lib.aliases)
        extensions |= lib.extensions

    def canonical(name: str) -> str:
        seen = set()
        while name not in functions and name not in seen:
            seen.add(name)
            parent, _, attr = name.rpartition(".")
            if name in aliases:
                name = aliases[name]
            elif parent in aliases:
                name = f"{aliases[parent]}.{attr}"
            else:
                break
        return name

    verdicts: dict[str, tuple] = {}
    reason: dict[str, str] = {}
    via: dict[str, str] = {}
    callers: dict[str, set[str]] = {}
    for fn in functions.values():
        for api_name in sorted(fn.apis):
            if api_name not in verdicts:
                verdicts[api_name] = classify(api_name, context.api)
            status, _, advice = verdicts[api_name]
            if status == UNSUPPORTED:
                fn.direct.append(f"uses {api_name}: {advice}")
        for call in fn.calls:
            if any(call == e or call.startswith(e + ".") for e in extensions):
                fn.direct.append(f"calls the CUDA extension {call}")
                continue
            target = canonical(call)
            if target in functions and target != fn.qualname:
                callers.setdefault(target, set()).add(fn.qualname)
        if fn.direct:
            reason[fn.qualname] = fn.direct[0]
            via[fn.qualname] = ""
    queue = deque(sorted(reason))
    while queue:
        name = queue.popleft()
        for caller in sorted(callers.get(name, ())):
            if caller in reason:
                continue
            reason[caller] = reason[name]
            chain = via[name]
            via[caller] = f"{name} -> {chain}" if chain else name
            queue.append(caller)
    rows = []
    for name in sorted(reason):
        fn = functions[name]
        rows.append([name, fn.kind, fn.location, reason[name], via[name]])
    for alias, target in sorted(aliases.items()):
        target = canonical(target)
        if target in reason and alias != target:
            rows.append(
                [
                    alias,
                    "alias",
                    functions[target].location,
                    reason[target],
                    f"{target} -> {via[target]}" if via[target] else target,
                ]
            )
    context.library_rows = rows
    return {row[0]: _why(row) for row in rows}


def _why(row: list) -> str:
    name, _, _, reason, chain = row
    return f"{reason} (via {chain})" if chain else reason


def read_api_file(path: Path) -> dict[str, str]:
    """Qualified name -> reason from a full_unsupported_results.csv (`--api-files`)."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as exc:
        raise AnalysisError(f"{path}: cannot read --api-files CSV: {getattr(exc, 'strerror', None) or exc}") from None
    except csv.Error as exc:
        raise AnalysisError(f"{path}: not a valid CSV: {exc}") from None
    if not rows or rows[0][: len(API_FILE_HEADER)] != API_FILE_HEADER:
        raise AnalysisError(
            f"{path}: not a full_unsupported_results.csv (expected the header {','.join(API_FILE_HEADER)})"
        )
    out = {}
    for number, row in enumerate(rows[1:], start=2):
        if len(row) < len(API_FILE_HEADER) or not row[0]:
            raise AnalysisError(f"{path}:{number}: expected {len(API_FILE_HEADER)} columns")
        out[row[0]] = _why(row[: len(API_FILE_HEADER)])
    return out


MODE = Mode("third_party", "Third-party libraries", scan=scan, collect=collect, prepare=prepare)
