"""Guard flips that would send an NPU host into code that cannot run there (issue #13).

A rewrite must never make a program crash on an NPU host where it ran on a CUDA host. Rules mark the fixes
that flip a *guard* (a test of whether CUDA is there: `torch.cuda.is_available()`, `x.is_cuda`,
`device.type == "cuda"`) and the reports whose code, left as it is, *crashes* on an NPU. On an NPU host
(a CPU build of torch) the original program took the non-CUDA side of every guard; flipped, the guard
takes the other side, so whatever there still cannot run on an NPU must be migrated in the same change,
or the guard stays as it is and its finding names the line that blocks it.

What a guard guards: the branch of an `if` / `elif` / `while` / conditional expression that now runs (for
`!=` and `not`, the `else` side; when that branch leaves by `return` / `raise` / `continue` / `break`,
what follows it up to the function, `try` or loop it leaves, through `with` and `if` blocks; otherwise
the tests of the flags it sets, whatever else it does, as `warnings.warn(...)` then `fp8 = False`), what
follows an `assert` of it, the right operand of `and` / `or`, and the tests of a variable or
attribute assigned from the guard (`HAS_GPU = torch.cuda.is_available()`, then every test of `HAS_GPU` in
the function or module, on the side the flipped value takes). Code that cannot run there: the reports
marked `crashes` whose fix does not stand, the tool's own warnings and errors of the device, torch.cuda,
distributed and AMP families left unfixed (`nn.DataParallel`, reported unsupported), uses of a package
that only runs on NVIDIA GPUs (`transforms/data/third_party.toml`), CUDA-only torch ops
(`torch._scaled_mm`, `CUDA_ONLY_OPS`) and prebuilt kernels fetched from the hub (`kernels.get_kernel`).

A guard that goes with a test of a CUDA-only package's presence (`flash_attn_func is not None and
q.is_cuda`, a flag its try-import sets, `is_flash_attn_2_available()`, an `if` around it) is never
flipped: whatever the code behind it is, it is where that package's kernel takes the tensors.

The same walk also leaves alone the CUDA branch of code that already supports the NPU (an if-chain that
tests for "npu" too, a comparison of a value also compared with "npu" and all it guards): its rewrites
are dropped (`FileContext.keep_cuda`).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from npu_migrate.findings import Severity
from npu_migrate.program.api import cuda_package, package_table
from npu_migrate.program.imports import handler_catches_import_error

# `ctx` below is the file's `context.FileContext` (which calls `check`), a report its `context.CstReport`.

# torch ops that call cuBLAS / CUDA-only kernels and have no NPU implementation; NPU203 reports them too
# (`transforms/cuda_only_ops.py`), where it is selected.
_QUANTISED = (
    "torch_npu's quantised matmuls take int4 and int8 weights: torch_npu.npu_weight_quant_batchmatmul, with "
    "the weight packed by torch_npu.npu_convert_weight_to_int4pack (their layouts and scales differ from "
    "tinygemm's: requantise from the float weight)"
)

#: The op (as `torch.X`) -> what it is and what to do on an NPU.
CUDA_ONLY_OPS = {
    "torch._scaled_mm": "an fp8 matmul on cuBLASLt; on an NPU keep the bf16 / fp16 matmul, or use "
    "torch_npu.npu_quant_matmul for int8",
    "torch._scaled_grouped_mm": "a grouped fp8 matmul on cuBLASLt; on an NPU keep the bf16 / fp16 grouped "
    "matmul (torch_npu.npu_grouped_matmul)",
    "torch._cslt_sparse_mm": "a 2:4 sparse matmul on cuSPARSELt; on an NPU use the dense matmul",
    "torch._weight_int4pack_mm": f"tinygemm's int4 packed matmul (CUDA and MPS only); {_QUANTISED}",
    "torch._convert_weight_to_int4pack": f"the packing of tinygemm's int4 matmul (CUDA and MPS only); {_QUANTISED}",
}


def cuda_only_op(qualname: str | None) -> str | None:
    """The `torch.X` name of a CUDA-only op reached as `torch.X`, `torch.ops.aten.X` or `torch.ops.aten.X.<overload>`."""
    if not qualname:
        return None
    parts = qualname.split(".")
    if parts[:3] == ["torch", "ops", "aten"] and len(parts) in (4, 5):
        parts = ["torch", parts[3]]
    name = ".".join(parts)
    return name if name in CUDA_ONLY_OPS else None


CUDA_ONLY_TORCH_OPS = frozenset(CUDA_ONLY_OPS)
#: Calls that fetch a prebuilt kernel from the Hugging Face hub (the `kernels` package): the builds are
#: CUDA (or ROCm / Metal) ones, none for an Ascend NPU, so the probe fails or loads code that cannot run.
KERNEL_HUB_CALLS = frozenset({"kernels.get_kernel", "kernels.get_local_kernel", "kernels.load_kernel"})

_NEGATING = (cst.NotEqual, cst.NotIn, cst.IsNot)


@dataclass(frozen=True)
class Unsafe:
    """A node that fails on an NPU host, and what to say about it."""

    node: cst.CSTNode
    why: str


class _Tree(cst.CSTVisitor):
    """Parent links of every node, and the names and chains that reach CUDA-only code."""

    def __init__(self, ctx, cuda_only: dict[str, str]) -> None:
        super().__init__()
        self.ctx = ctx
        self.cuda_only = cuda_only  # local name -> the CUDA-only package it comes from
        self.parents: dict[int, cst.CSTNode] = {}
        self.stack: list[cst.CSTNode] = []
        self.names: dict[str, list[cst.CSTNode]] = {}  # loads of a plain name, and `self.x` chains as "self.x"
        self.unsafe: list[Unsafe] = []
        self._ops = _mentions_ops(ctx.text)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.parents[id(node)] = self.stack[-1]
        self.stack.append(node)
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            package = self._cuda_only_import(node)
            if package is not None:
                self.unsafe.append(Unsafe(node, f"imports {package}, which only runs on NVIDIA GPUs"))
            return False
        if isinstance(node, cst.Name) and not self._is_attribute_name(node):
            self.names.setdefault(node.value, []).append(node)
            package = self.cuda_only.get(node.value)
            if package is not None and self._is_used(node):
                self.unsafe.append(Unsafe(node, f"uses `{node.value}` from {package}, which only runs on NVIDIA GPUs"))
        elif isinstance(node, cst.Attribute):
            if isinstance(node.value, cst.Name) and node.value.value == "self":
                self.names.setdefault(f"self.{node.attr.value}", []).append(node)
            if self._ops:
                op = cuda_only_op(self.ctx.qualname(node))
                if op is not None:
                    self.unsafe.append(Unsafe(node, f"calls `{op}`, a CUDA-only torch op"))
        if isinstance(node, cst.Call) and self._ops:
            qualname = self.ctx.qualname(node.func)
            if qualname in KERNEL_HUB_CALLS:
                self.unsafe.append(
                    Unsafe(node, f"calls `{qualname}`, which fetches a prebuilt kernel the hub has no NPU build of")
                )
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()

    def _cuda_only_import(self, node: cst.Import | cst.ImportFrom) -> str | None:
        """The CUDA-only package an import imports, unless it sits in the body of a `try` that catches the
        ImportError (in a handler, `else` or `finally` it raises as anywhere): it raises on an NPU host, even
        where nothing after it uses what it binds."""
        for parent, child in zip(self.stack, self.stack[1:]):
            if (
                isinstance(parent, cst.Try)
                and child is parent.body
                and any(map(_catches_import_error, parent.handlers))
            ):
                return None
        return self.cuda_only_package(node)

    @staticmethod
    def cuda_only_package(node: cst.Import | cst.ImportFrom) -> str | None:
        """The CUDA-only package an import imports, wherever it is."""
        if isinstance(node, cst.Import):
            names = [get_full_name_for_node(alias.name) for alias in node.names]
        elif node.relative or node.module is None:
            return None
        else:
            module = get_full_name_for_node(node.module)
            aliases = [] if isinstance(node.names, cst.ImportStar) else node.names
            names = [f"{module}.{get_full_name_for_node(alias.name)}" for alias in aliases] or [module]
        table = package_table()
        return next((hit[0] for name in names if name and (hit := cuda_package(name, table)) is not None), None)

    def _is_attribute_name(self, node: cst.Name) -> bool:
        parent = self.stack[-2] if len(self.stack) > 1 else None
        return isinstance(parent, cst.Attribute) and parent.attr is node

    def _is_used(self, node: cst.Name) -> bool:
        """Read for its value (`rms_norm(x)`, `flash_attn.flash_attn_func`, `fn = flash_attn_func`), not only
        tested for presence (`rms_norm is not None`) nor assigned (`rms_norm = None`)."""
        parent = self.stack[-2] if len(self.stack) > 1 else None
        if isinstance(parent, (cst.AssignTarget, cst.Param)) or (
            isinstance(parent, cst.Arg) and parent.keyword is node
        ):
            return False
        if isinstance(parent, cst.Comparison):
            return not all(
                isinstance(c.operator, (cst.Is, cst.IsNot)) and isinstance(c.comparator, cst.Name)
                for c in parent.comparisons
            )
        return True

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(id(node))

    def inside(self, node: cst.CSTNode, regions: set[int]) -> bool:
        while node is not None:
            if id(node) in regions:
                return True
            node = self.parent(node)
        return False


cuda_only_package = _Tree.cuda_only_package


def check(ctx, line_of: Callable[[cst.CSTNode], int]) -> bool:
    """Leave as they are the guard flips whose guarded code cannot run on an NPU, and drop the rewrites in
    the CUDA branches of code that already supports the NPU. Returns whether an import rewrite was vetoed
    (the caller decides the imports again)."""
    guards = [r for r in ctx.reports if r.guard and r.applied]
    guard_imports = [plan for plan in ctx.accepted_plans if plan.guard]
    kept = ctx.kept_cuda
    if not guards and not guard_imports and not kept:
        return False
    cuda_only = _cuda_only_bindings(ctx)
    crashing = [r for r in ctx.reports if _does_not_run(r)]
    tests_packages = cuda_only or _PACKAGE_TEST_TEXT.search(ctx.text) is not None
    if not kept and not crashing and not tests_packages and not _mentions_ops(ctx.text) and _PRESENCE not in ctx.text:
        return False
    tree = _Tree(ctx, cuda_only)
    ctx.module.visit(tree)
    if kept:
        regions = {id(node) for node in kept}
        for node in kept:
            if isinstance(node, cst.Comparison):
                # A CUDA test kept as it is: what it guards, and the tests beside it in an `and`, stay too.
                regions |= {id(n) for n in _guarded(tree, node, ctx)}
                regions |= {id(n) for n in _and_mates(tree, node)}
        # The rule that kept a branch says so once, at its test; nothing inside it is rewritten or reported.
        for report in [r for r in ctx.reports if id(r.node) not in regions and tree.inside(r.node, regions)]:
            ctx.drop(report)
    unsafe = [Unsafe(r.node, _crash_why(ctx, r)) for r in ctx.reports if _does_not_run(r)]
    unsafe += tree.unsafe
    if not unsafe and _PRESENCE not in ctx.text and not tests_packages:  # nor a fast path tested for presence
        return False
    unsafe += _calls_reaching(tree, ctx, unsafe, line_of)
    presence = presence_names(ctx)
    for guard in guards:
        what = _guard_code(tree, guard.node, ctx)
        package_test = _tests_presence(tree, guard.node, presence)
        blocking = _blocking(tree, guard.node, ctx, unsafe) if package_test is None else None
        if package_test is not None:
            # Whatever the code behind it does: the test asks whether a CUDA-only package's kernel may
            # take these tensors. Flipped, it hands NPU tensors to that kernel wherever the package imports.
            guard.message = (
                f"`{what}` left as is: it decides, with `{ctx.code(package_test).strip()}` (line "
                f"{line_of(package_test)}), whether a CUDA-only package's kernel runs, and that kernel never "
                "takes NPU tensors; on an NPU host the code's own fallback runs"
            )
        elif blocking is not None:
            guard.message = (
                f"`{what}` left as is: the code it guards at line {line_of(blocking.node)} {blocking.why}; "
                "migrate that code, then this test"
            )
        elif unsafe and _escapes(tree, guard.node):
            # Returned, passed on or packed: the code it decides is out of sight, and this file has code
            # that cannot run on an NPU. Not knowing is not safe.
            blocking = unsafe[0]
            guard.message = (
                f"`{what}` left as is: its value is passed on where it cannot be followed, and the code at line "
                f"{line_of(blocking.node)} {blocking.why}; migrate that code, then this test"
            )
        else:
            continue
        guard.severity = Severity.WARNING
        guard.applied = False
        guard.fix = None
    # A guard reached through `from torch.cuda import is_available` is flipped by its import: that stays.
    vetoed_import = False
    for plan in guard_imports:
        for use in tree.names.get(plan.binding.local, ()):
            blocking = _blocking(tree, use, ctx, unsafe)
            if blocking is not None:
                ctx.veto(plan.binding, f"it guards code at line {line_of(blocking.node)} that {blocking.why}")
                vetoed_import = True
                break
    return vetoed_import


class _ValueNodes(cst.CSTVisitor):
    """The nodes whose value is the assigned value, or decides it as a flag does (`a and b`, `not a`,
    `a > 1`): not a conditional expression's test (`"npu" if ok else "cpu"`), nor an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.IfExp, cst.Arg, cst.Lambda, cst.Subscript)):
            return False
        self.ids.add(id(node))
        return True


def note_module_flags(ctx) -> None:
    """A flipped guard assigned to a module-level name (`HAS_GPU = torch.cuda.is_available()`) may be tested
    in another module (`if utils.HAS_GPU: ...`), which this file's check cannot see: the engine reads one file
    at a time, and deciding this file from another's uses would need a pass over the project before any
    rewrite. Its finding says so, and what to check."""
    flipped = {id(r.node): r for r in ctx.reports if r.guard and r.applied}
    if not flipped:
        return
    for statement in ctx.module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not isinstance(small, (cst.Assign, cst.AnnAssign)) or small.value is None:
                continue
            names = [t.value for t in _targets(small) if isinstance(t, cst.Name)]
            if not names:
                continue
            nodes = _ValueNodes()
            small.value.visit(nodes)
            for key in nodes.ids & flipped.keys():
                report = flipped[key]
                flags = ", ".join(f"`{name}`" for name in names)
                note = (
                    f"; {flags} is module-level: its tests in other modules are not followed, check that the code "
                    "they guard runs on an NPU (`npu-migrate verify --smoke`)"
                )
                if note not in report.message:
                    report.message += note


def _calls_reaching(tree: _Tree, ctx, unsafe: list[Unsafe], line_of) -> list[Unsafe]:
    """Calls of the file's own functions whose bodies hold unsafe code: a guard that calls `attend(x)`, which
    calls `xops.memory_efficient_attention`, sends an NPU host there as surely as the call written inline.
    Module-level functions by name, methods as `self.name(...)` within their class or a subclass of the
    file. A use of a CUDA-only name under an `if` that tests that name (`if xops is not None:`) is the
    function's own fallback: not followed."""
    # To any depth (`fast` -> `attend` -> xops); each function is flagged once, which also ends cycles.
    functions: dict[str, list[cst.FunctionDef]] = {}
    classes = {s.name.value: s for s in ctx.module.body if isinstance(s, cst.ClassDef)}
    for statement in ctx.module.body:
        if isinstance(statement, cst.FunctionDef):
            functions.setdefault(statement.name.value, []).append(statement)
        elif isinstance(statement, cst.ClassDef):
            for member in statement.body.body:
                if isinstance(member, cst.FunctionDef):
                    functions.setdefault(f"self.{member.name.value}", []).append(member)
    if not functions:
        return []
    owner = {id(f): name for name, defs in functions.items() for f in defs}
    reached: list[Unsafe] = []
    flagged: set[int] = set()  # by definition: two classes may each have a method of the same name
    frontier = [u for u in unsafe if not _tested_in_place(tree, u.node)]
    while frontier:
        found = []
        for u in frontier:
            function = _scope(tree, u.node)
            name = owner.get(id(function)) if function is not None else None
            if name is None or id(function) in flagged:
                continue
            flagged.add(id(function))
            for use in tree.names.get(name, ()):
                call = tree.parent(use)
                if not (isinstance(call, cst.Call) and call.func is use) or _scope(tree, use) is function:
                    continue
                if name.startswith("self.") and not _finds_method(
                    _enclosing(tree, use, cst.ClassDef), _enclosing(tree, function, cst.ClassDef), name[5:], classes
                ):
                    continue  # another class's method of that name
                shown = name.removeprefix("self.")
                found.append(Unsafe(use, f"calls `{shown}` (line {line_of(function)}), which {u.why}"))
        reached += found
        frontier = found
    return reached


def _finds_method(
    cls: cst.ClassDef | None, owner: cst.ClassDef | None, method: str, classes: dict[str, cst.ClassDef]
) -> bool:
    """Whether `self.method` in class `cls` reaches `owner`'s method: `cls` is `owner`, or inherits it from
    a base of the file (`classes`) that is (a method of `cls`'s own, or of a nearer base, comes first)."""
    seen: set[int] = set()
    while cls is not None and id(cls) not in seen:
        if cls is owner:
            return True
        seen.add(id(cls))
        if any(isinstance(m, cst.FunctionDef) and m.name.value == method for m in cls.body.body):
            return False
        bases = [classes.get(b.value.value) for b in cls.bases if isinstance(b.value, cst.Name)]
        cls = next((b for b in bases if b is not None), None)  # the first base of the file: Python's MRO start
    return False


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    """Whether the handler catches a failed import and goes on (a re-raise fails as the import did)."""
    body = handler.body.body
    if body and isinstance(body[-1], cst.SimpleStatementLine) and isinstance(body[-1].body[-1], cst.Raise):
        return False
    return handler_catches_import_error(handler)


def _enclosing(tree: _Tree, node: cst.CSTNode, kind: type[cst.CSTNode]):
    """The nearest node of `kind` around `node` (its function, its class), or None."""
    node = tree.parent(node)
    while node is not None and not isinstance(node, kind):
        node = tree.parent(node)
    return node


def _tested_in_place(tree: _Tree, node: cst.CSTNode) -> bool:
    """A use of a name under an `if` / `while` / conditional expression whose test reads the name."""
    if not isinstance(node, cst.Name):
        return False
    child, parent = node, tree.parent(node)
    while parent is not None and not isinstance(parent, cst.FunctionDef):
        if isinstance(parent, (cst.If, cst.While, cst.IfExp)) and child is not parent.test:
            if any(isinstance(n, cst.Name) and n.value == node.value for n in _walk(parent.test)):
                return True
        child, parent = parent, tree.parent(parent)
    return False


_DEFINITIONS = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def _walk(node: cst.CSTNode, skip: tuple[type[cst.CSTNode], ...] = ()) -> Iterator[cst.CSTNode]:
    """`node` and all below it, except inside the nodes of the kinds `skip` names."""
    yield node
    for child in node.children:
        if not isinstance(child, skip):
            yield from _walk(child, skip)


def _blocking(tree: _Tree, guard: cst.CSTNode, ctx, unsafe: list[Unsafe]) -> Unsafe | None:
    """The first code that cannot run on an NPU among what `guard` guards, if any."""
    regions = {id(node) for node in _guarded(tree, guard, ctx)}
    if not regions:
        return None
    return next((u for u in [*unsafe, *_fast_path_calls(tree, guard)] if tree.inside(u.node, regions)), None)


_PRESENCE = " is not None"


def _fast_path_calls(tree: _Tree, guard: cst.CSTNode) -> Iterator[Unsafe]:
    """`if fast_kernel is not None and x.is_cuda: fast_kernel(x)`: a kernel that may be missing (an optional
    import of a CUDA library we need not know) which the code hands only CUDA tensors. Flipped, the guard
    would hand it NPU tensors; kept, the NPU takes the portable code after it."""
    test = guard
    while isinstance(tree.parent(test), cst.BooleanOperation) and isinstance(tree.parent(test).operator, cst.And):
        test = tree.parent(test)
    if test is guard:
        return
    present = {
        condition.left.value
        for condition in _conjuncts(test)
        if isinstance(condition, cst.Comparison)
        and isinstance(condition.left, cst.Name)
        and len(condition.comparisons) == 1
        and isinstance(condition.comparisons[0].operator, cst.IsNot)
        and isinstance(condition.comparisons[0].comparator, cst.Name)
        and condition.comparisons[0].comparator.value == "None"
    }
    for name in sorted(present):
        for node in tree.names.get(name, ()):
            call = tree.parent(node)
            if isinstance(call, cst.Call) and call.func is node:
                yield Unsafe(node, f"calls `{name}`, a fast path the original runs only on CUDA tensors")


#: Functions that test whether a CUDA-only package is installed (transformers' and diffusers' utilities).
_PACKAGE_TESTS = re.compile(r"^_?is_(flash_attn|xformers|apex|bitsandbytes)")
_PACKAGE_TEST_TEXT = re.compile(r"\b_?is_(flash_attn|xformers|apex|bitsandbytes)")
#: Values that only test: a flag assigned one of these from a presence test is a presence test itself.
_TESTS = (cst.Name, cst.Comparison, cst.BooleanOperation, cst.UnaryOperation, cst.Call)


def presence_names(ctx) -> dict[str, str]:
    """The names whose truth says whether a CUDA-only package imported, with the package: the names it
    binds (`flash_attn_func`, None where the import failed), the flags a try-import of it sets (`HAS_FLASH =
    True` in its body, `= False` in its handler), and the names assigned a test of those (`use_flash =
    HAS_FLASH`), at module level or in a function. Computed once per file (NPU803 and the guards both
    ask), and the module is walked only where the text can hold one (#26: the walk costs a libcst visit)."""
    found = _PRESENCE_NAMES.get(ctx)
    if found is None:
        found = _PRESENCE_NAMES[ctx] = _presence_names(ctx)
    return dict(found)


#: `presence_names` per file: keyed by the file's context, gone with it.
_PRESENCE_NAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TRY = re.compile(r"\btry\s*:")


def statements_of(module: cst.Module) -> list[cst.CSTNode]:
    """Every statement of the module, small (`x = 1`, `assert`) and compound (`if`, `try`, `def`), in the
    order a walk of the whole tree meets them. Statements hold statements only through their blocks, so the
    expressions, most of the tree, are never walked: a tenth of what a libcst visit costs (#26)."""
    found: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = list(reversed(module.body))
    while stack:
        node = stack.pop()
        if isinstance(node, cst.SimpleStatementLine):
            found.extend(node.body)
            continue
        found.append(node)
        inner: list[cst.CSTNode] = []
        for name in _BLOCKS:
            part = getattr(node, name, None)
            if part is None:
                continue
            for block in part if isinstance(part, (list, tuple)) else (part,):
                if isinstance(block, cst.BaseCompoundStatement):  # an `elif`
                    inner.append(block)
                elif isinstance(block, (cst.IndentedBlock, cst.SimpleStatementSuite)):
                    inner.extend(block.body)
                else:  # `else:`, `finally:`, an `except` clause, a `case`: what holds a block
                    body = block.body
                    inner.extend(
                        body.body if isinstance(body, (cst.IndentedBlock, cst.SimpleStatementSuite)) else [body]
                    )
        stack.extend(reversed(inner))
    return found


#: Where a compound statement holds statements, in the order of the code.
_BLOCKS = ("body", "handlers", "orelse", "finalbody", "cases")


def _presence_names(ctx) -> dict[str, str]:
    names = dict(_cuda_only_bindings(ctx))
    if ctx.text and not names and _TRY.search(ctx.text) is None and _PACKAGE_TEST_TEXT.search(ctx.text) is None:
        # No name to start from, no `try` to bind one, and no package test for an assignment to read.
        return names
    statements = statements_of(ctx.module)
    for node in statements:
        if not isinstance(node, cst.Try):
            continue
        imported = [n for n in _walk(node.body) if isinstance(n, (cst.Import, cst.ImportFrom))]
        package = next((p for n in imported if (p := _Tree.cuda_only_package(n)) is not None), None)
        if package is None:
            continue
        for part in (node.body, *(handler.body for handler in node.handlers)):
            for assign in _walk(part, _DEFINITIONS):
                if isinstance(assign, (cst.Assign, cst.AnnAssign)):
                    for target in _targets(assign):
                        if isinstance(target, cst.Name):
                            names.setdefault(target.value, package)
    assigns = [n for n in statements if isinstance(n, cst.Assign) and isinstance(n.value, _TESTS)]
    grown = True
    while grown:
        grown = False
        for assign in assigns:
            targets = {t.value for t in _targets(assign) if isinstance(t, cst.Name)} - names.keys()
            found = presence_node(assign.value, names) if targets else None
            if found is not None:
                names.update(dict.fromkeys(targets, presence_package(found, names)))
                grown = True
    return names


def presence_package(node: cst.CSTNode, names: dict[str, str]) -> str:
    """The package a presence test (`presence_node`) asks about."""
    if isinstance(node, cst.Name):
        return names[node.value]
    callee = (get_full_name_for_node(node.func) or "").rsplit(".", 1)[-1]
    return _PACKAGE_TESTS.match(callee).group(1)


def presence_node(test: cst.BaseExpression, names: set[str]) -> cst.CSTNode | None:
    """The part of `test` that reads a presence name or calls a package test (`is_flash_attn_2_available()`)."""
    if isinstance(test, cst.Call) and not isinstance(test.func, (cst.Name, cst.Attribute)):
        return None
    for node in _walk(test, (cst.Lambda,)):
        if isinstance(node, cst.Name) and node.value in names:
            return node
        if isinstance(node, cst.Call):
            callee = get_full_name_for_node(node.func) or ""
            if _PACKAGE_TESTS.match(callee.rsplit(".", 1)[-1]):
                return node
    return None


def _tests_presence(tree: _Tree, guard: cst.CSTNode, names: set[str]) -> cst.CSTNode | None:
    """The test of a CUDA-only package's presence that the guard goes with, if any: a conjunct of the
    `and` it is part of (`flash_attn_func is not None and q.is_cuda`), or the test of an `if` around it
    (`if HAS_FLASH:` ... `if q.is_cuda:`)."""
    child, node = guard, tree.parent(guard)
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And):
            other = node.right if child is node.left else node.left
            found = presence_node(other, names)
            if found is not None:
                return _conjunct_of(found, other, tree)
        elif isinstance(node, (cst.If, cst.While, cst.IfExp)) and child is not node.test:
            found = presence_node(node.test, names)
            if found is not None:
                return _conjunct_of(found, node.test, tree)
        child, node = node, tree.parent(node)
    return None


def _conjunct_of(node: cst.CSTNode, test: cst.BaseExpression, tree: _Tree) -> cst.CSTNode:
    """The conjunct of `test` that holds `node` (`flash_attn_func is not None`, not only its name)."""
    for conjunct in _conjuncts(test):
        if tree.inside(node, {id(conjunct)}):
            return conjunct
    return node


def _and_mates(tree: _Tree, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The other operands of the `and`s `node` is an operand of (`a == "cuda" and torch.cuda.is_available()`)."""
    child, parent = node, tree.parent(node)
    while isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.And):
        yield parent.right if child is parent.left else parent.left
        child, parent = parent, tree.parent(parent)


def _conjuncts(test: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        yield from _conjuncts(test.left)
        yield from _conjuncts(test.right)
    else:
        yield test


def _mentions_ops(text: str) -> bool:
    return not text or any(op.rsplit(".", 1)[1] in text for op in (*CUDA_ONLY_TORCH_OPS, *KERNEL_HUB_CALLS))


def _cuda_only_bindings(ctx) -> dict[str, str]:
    table = package_table()
    found = {}
    # A name bound in a `try: from flash_attn ... / except ImportError: name = None` is shadowed, and still
    # CUDA-only where it is called.
    imported = {local: b.qualname for local, b in ctx.imports.bindings.items()} | ctx.imports.shadowed
    for local, qualname in imported.items():
        hit = cuda_package(qualname, table)
        if hit is not None:
            found[local] = hit[0]
    return found


#: The families whose findings on code left as it is say it does not run on an NPU as written (device,
#: torch.cuda API, distributed, AMP): `nn.DataParallel` reported unsupported at a line a flipped guard sends an
#: NPU host to is a crash the tool itself announced. Not the backend settings (`cudnn.benchmark` is read and
#: ignored there), nor the fused families (a declined fusion runs the original code).
_NOT_RUNNING_FAMILIES = ("NPU1", "NPU2", "NPU3", "NPU4")


def _does_not_run(report) -> bool:
    """A report on code that is left as it is and fails on an NPU host: marked `crashes`, or a warning or
    error of a family above (not a guard's own finding: a test left as it is only keeps its CUDA side)."""
    if report.applied:
        return False
    if report.crashes:
        return True
    return (
        not report.guard
        and report.severity in (Severity.WARNING, Severity.ERROR)
        and report.rule.id.startswith(_NOT_RUNNING_FAMILIES)
    )


def _crash_why(ctx, report) -> str:
    code = ctx.code(report.node).strip()
    if len(code) > 60:
        code = code[:57] + "..."
    return f"has `{code}`, which is not migrated ({report.rule.id})"


def _guard_code(tree: _Tree, node: cst.CSTNode, ctx) -> str:
    """The test the guard node is part of, as the user wrote it (`torch.cuda.is_available()`)."""
    parent = tree.parent(node)
    if isinstance(parent, cst.Call) and parent.func is node:
        node = parent
    elif isinstance(parent, cst.Comparison):
        node = parent
    elif isinstance(parent, cst.ComparisonTarget):
        node = tree.parent(parent) or node
    return ctx.code(node).strip()


def _guarded(
    tree: _Tree, node: cst.CSTNode, ctx, seen: set[str] | None = None, positive: bool = True
) -> Iterator[cst.CSTNode]:
    """The nodes whose code runs on an NPU host once the guard at `node` is flipped (and did not before);
    `positive` False for a value that is true where CUDA is missing."""
    seen = set() if seen is None else seen
    current = node
    while True:
        parent = tree.parent(current)
        if parent is None:
            return
        if isinstance(parent, cst.Call) and parent.func is current:
            pass
        elif isinstance(parent, cst.ComparisonTarget):
            if isinstance(parent.operator, _NEGATING):
                positive = not positive
        elif isinstance(parent, cst.Comparison):
            if current is parent.left and any(isinstance(t.operator, _NEGATING) for t in parent.comparisons):
                positive = not positive
        elif isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
            positive = not positive
        elif isinstance(parent, cst.BooleanOperation):
            if current is parent.left and isinstance(parent.operator, cst.And) == positive:
                yield parent.right
        elif isinstance(parent, (cst.If, cst.While)) and parent.test is current:
            yield from _branch(tree, parent, positive, ctx, seen)
            return
        elif isinstance(parent, cst.IfExp) and parent.test is current:
            yield parent.body if positive else parent.orelse
            return
        elif isinstance(parent, cst.Assert) and parent.test is current:
            # `assert torch.cuda.is_available(), "needs CUDA"` stopped an NPU host; flipped, what follows runs.
            if positive:
                yield from _after_exit(tree, parent, cst.Raise())
            return
        elif isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            yield from _flag_tests(tree, parent, ctx, seen, (positive,))
            return
        else:
            return
        current = parent


_ESCAPES = (cst.Return, cst.Arg, cst.Tuple, cst.List, cst.Element, cst.Dict, cst.DictElement, cst.NamedExpr, cst.Lambda)


def _escapes(tree: _Tree, node: cst.CSTNode) -> bool:
    """Whether the guard's value leaves the expression it is in (`return torch.cuda.is_available()`,
    `M(use_cuda=x.is_cuda)`, `ok, n = torch.cuda.is_available(), 2`, a walrus) before any test uses it."""
    current = node
    while (parent := tree.parent(current)) is not None:
        if isinstance(parent, _ESCAPES):
            return True
        if not isinstance(
            parent, (cst.Call, cst.ComparisonTarget, cst.Comparison, cst.UnaryOperation, cst.BooleanOperation)
        ):
            return False
        if isinstance(parent, cst.Call) and parent.func is not current:
            return True  # an argument: `cst.Arg` above catches the usual case
        current = parent
    return False


def _branch(tree: _Tree, statement: cst.If | cst.While, positive: bool, ctx, seen: set[str]) -> Iterator[cst.CSTNode]:
    if positive:
        yield statement.body
        return
    if statement.orelse is not None:
        yield statement.orelse
    body = statement.body.body
    last = _last_small(body[-1]) if body else None
    if isinstance(last, (cst.Return, cst.Raise, cst.Continue, cst.Break)):
        yield from _after_exit(tree, statement, last)
        return
    # Flags set where CUDA is missing: flipped, they keep their other value, so what changes is the code
    # that tests them, not all that follows (`x = 1` then CUDA-only code that never reads `x`). A flag we
    # cannot follow (`args.fp8 = False`) may be read anywhere after: all that follows counts. Whatever
    # else the branch does (`warnings.warn("--fp8 needs CUDA, ignored")`) only stops happening: the
    # assignments in it, at any depth, are what decide the code after it.
    assignments = [
        x for x in _walk(statement.body, _DEFINITIONS) if isinstance(x, (cst.Assign, cst.AnnAssign, cst.AugAssign))
    ]
    for assign in assignments:
        if isinstance(assign, cst.AugAssign):
            yield from _after_exit(tree, statement, None)
            continue
        if all(_flag_key(target) is not None for target in _targets(assign)):
            yield from _flag_tests(tree, assign, ctx, seen, _flipped_sides(assign.value))
        else:
            yield from _after_exit(tree, statement, None)


def _flipped_sides(value: cst.BaseExpression | None) -> tuple[bool, ...]:
    """Which side of a test of a flag runs once the assignment `flag = value` (made only where CUDA is
    missing) no longer happens on an NPU: the flag keeps its other value. A false literal (`use_fp8 = False`)
    was the NPU's value, so the true side newly runs; a `True`, the false side; any other value, either."""
    if isinstance(value, cst.Name) and value.value in ("False", "None"):
        return (True,)
    if isinstance(value, cst.Integer) and value.value == "0":
        return (True,)
    if isinstance(value, cst.Name) and value.value == "True":
        return (False,)
    return (True, False)


def _after_exit(tree: _Tree, statement: cst.CSTNode, exit: cst.CSTNode | None) -> Iterator[cst.CSTNode]:
    """What runs after `statement` once its branch no longer leaves by `exit`: the rest of each enclosing
    block up to the function (`return`), the loop (`continue` / `break`) or the `try` that catches it
    (`raise`), through `with`, `if` and loop bodies (`with ctx: if not cuda: return` guards the code after
    the `with` too). No `exit`: the rest of the statement's own block."""
    child, node = statement, tree.parent(statement)
    while node is not None:
        if isinstance(node, (cst.IndentedBlock, cst.Module)):
            body = list(node.body)
            index = next((i for i, s in enumerate(body) if s is child), None)
            if index is not None:
                yield from body[index + 1 :]
            if exit is None:
                return
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        elif isinstance(node, (cst.For, cst.While)) and isinstance(exit, (cst.Continue, cst.Break)):
            return
        elif isinstance(node, (cst.Try, cst.TryStar)) and isinstance(exit, cst.Raise) and child is node.body:
            return
        child, node = node, tree.parent(node)


def _last_small(statement: cst.CSTNode) -> cst.CSTNode:
    if isinstance(statement, cst.SimpleStatementLine) and statement.body:
        return statement.body[-1]
    return statement


def _flag_tests(
    tree: _Tree, assign: cst.CSTNode, ctx, seen: set[str], sides: tuple[bool, ...]
) -> Iterator[cst.CSTNode]:
    """The code guarded by the tests of a flag assigned from a guard, in the function that assigns it
    (a module-level or `self.` flag: the whole module); `sides` says which side of a test of the flag now
    runs on an NPU (True: the side a true flag takes)."""
    for target in _targets(assign):
        key = _flag_key(target)
        if key is None or key in seen:
            continue
        seen.add(key)
        scope = _scope(tree, assign) if isinstance(target, cst.Name) else None
        for use in tree.names.get(key, ()):
            if use is target or (scope is not None and not tree.inside(use, {id(scope)})):
                continue
            for side in sides:
                yield from _guarded(tree, use, ctx, seen, side)


def _targets(assign: cst.CSTNode) -> list[cst.BaseExpression]:
    return [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]


def _flag_key(target: cst.BaseExpression) -> str | None:
    """How `_Tree.names` knows the uses of a flag: a plain name, or `self.x`; None for what it cannot follow."""
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
        return f"self.{target.attr.value}"
    return None


def _scope(tree: _Tree, node: cst.CSTNode) -> cst.CSTNode | None:
    return _enclosing(tree, node, cst.FunctionDef)
