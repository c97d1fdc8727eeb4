"""Fused-operator injection (NPU7xx): RMSNorm, SwiGLU, rotary embedding and SDPA get a torch_npu fast path.

The checker folds each function into the expression it returns (`symbolic.fold`) and asks the idioms,
one module each, whether that expression is theirs. An idiom module declares everything about itself in
`IDIOM = Idiom(...)` (`idiom.py`): the checker finds those modules and derives its rules, prefilters and
helpers from them, so there is nothing to register here. A match becomes a branch in front of the
untouched original body:

    def forward(self, hidden_states):
        if _is_npu(hidden_states) and <the kernel's constraints>:
            return _npu_rms_norm(hidden_states, self.weight, epsilon=self.variance_epsilon)[0]
        ...original code...

and the file gets, once, the helpers after its imports (`helpers.py`): a guarded `import torch_npu` (unless
the file imports it unconditionally), `_is_npu(x)`, true only when torch_npu imported and `x` is on an NPU,
and a typed function `_npu_<kernel>` per kernel the branches call, the one place that reaches
`torch_npu.npu_<kernel>`. A file of a package (`Source.helper_module`) imports the helpers it calls from
the package's helper module instead, which the driver writes once (`npu_migrate.helper_modules`). Off an NPU nothing changes, bit for bit. TorchScript, FX and torch.compile keep
working: `_is_npu` is False while TorchScript compiles (an early `torch.jit.is_scripting()` return) and
for FX proxies, and the kernel functions are `@torch.jit.unused`, compiled as stubs. A test (or
`verify`) substitutes CPU reference kernels through the module-level name `torch_npu` and forces
`_is_npu` true.

Module-level helpers the function calls (`rotate_half(q)`) are folded in too, so an idiom is known by
what it computes, not by a name. Attention is the exception to the branch scheme: an
`F.scaled_dot_product_attention` call sits among control flow and what decides the kernel's fit is
only known at run time, so the call is renamed to a typed wrapper with SDPA's signature (an idiom's
`calls`, `attention.py`).

A second run recognises the branches (`if _is_npu(` opening a body), the renamed calls and the helpers
by name.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from collections.abc import Mapping

import libcst as cst

from npu_migrate.astindex import AstIndex
from npu_migrate.checkers import TreeChecker
from npu_migrate.layout import fit, line_width
from npu_migrate.names import Names
from npu_migrate.scoped import Source, TreeReport
from npu_migrate.transforms.fused.helpers import (
    MODULE,
    PRELUDE,
    defined_names,
    helper_code,
    imported_helpers,
    kernel_templates,
    kernels_called,
    rendered,
    with_kernels,
)
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.symbolic import Function, Outcome, has_fused_branch


def _idioms() -> tuple[Idiom, ...]:
    """Every module of this package that declares an `IDIOM`, in rule-id order: a function two idioms
    could claim goes to the one with the lower id, then the module name decides."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        idiom = getattr(importlib.import_module(f"{__name__}.{module.name}"), "IDIOM", None)
        if isinstance(idiom, Idiom):
            found.append((idiom.rule.id, module.name, idiom))
    return tuple(idiom for *_, idiom in sorted(found, key=lambda entry: entry[:2]))


def _helper_names(idioms: tuple[Idiom, ...]) -> dict[str, str]:
    names = {PRELUDE: "_is_npu", **{template: name for name, template in kernel_templates().items()}}
    for idiom in idioms:
        for template, name in idiom.helpers.items():
            if names.setdefault(template, name) != name:
                raise ValueError(f"helper template {template} declared as defining {names[template]} and {name}")
    return names


IDIOMS = _idioms()
#: The module-level definition each helper template provides: present means already inserted.
HELPER_NAMES = _helper_names(IDIOMS)
#: Qualified name of a function whose calls an idiom rewrites in place -> that idiom.
CALL_IDIOMS = {name: idiom for idiom in IDIOMS for name in idiom.calls}
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.TryStar, ast.Match)


def _identifiers(node: ast.AST) -> set[str]:
    """Every name a statement binds or mentions, defs and classes by their names only (not their bodies)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (*_DEFS, ast.ClassDef)) and current is not node:
            found.add(current.name)
            continue
        if isinstance(current, ast.Name):
            found.add(current.id)
        elif isinstance(current, ast.Attribute):
            found.add(current.attr)
        elif isinstance(current, ast.alias):
            found.update((current.asname or current.name).split("."))
        elif isinstance(current, ast.arg):
            found.add(current.arg)
        elif isinstance(current, ast.ExceptHandler) and current.name:
            found.add(current.name)
        stack.extend(ast.iter_child_nodes(current))
    return found


class _ModuleFunctions(Mapping):
    """The module-level defs a fused idiom may call (`rotate_half`). A name the module defines twice or
    also binds otherwise is left out: which definition a call reaches is unknown."""

    def __init__(self, tree: ast.Module) -> None:
        defs: dict[str, ast.FunctionDef] = {}
        rebound: set[str] = set()
        for stmt in tree.body:
            if isinstance(stmt, _DEFS):
                if stmt.name in defs:
                    rebound.add(stmt.name)
                defs[stmt.name] = stmt
            elif isinstance(stmt, ast.ClassDef):
                rebound.add(stmt.name)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                rebound.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                rebound.update((a.asname or a.name) for a in stmt.names if a.name != "*")
            elif isinstance(stmt, _BLOCKS):  # `if`/`try`/`with` at top level: whatever they bind
                rebound.update(_identifiers(stmt))
        self._nodes = {name: node for name, node in defs.items() if name not in rebound}

    def __getitem__(self, name: str) -> ast.FunctionDef:
        return self._nodes[name]

    def __iter__(self):
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _prelude_anchor(tree: ast.Module) -> tuple[ast.stmt, bool]:
    """The top-level statement the helpers go next to, and whether after it: after the last import line
    that precedes the first def or class, else after the docstring and `__future__` imports, else first.
    Statements sharing a line (`import a; import b`) count as one line, an import line if all are."""
    lines: list[list[ast.stmt]] = []
    for stmt in tree.body:
        if lines and stmt.lineno <= lines[-1][-1].end_lineno:
            lines[-1].append(stmt)
        else:
            lines.append([stmt])
    index = 1 if lines and len(lines[0]) == 1 and _is_docstring(lines[0][0]) else 0
    while index < len(lines) and all(isinstance(s, ast.ImportFrom) and s.module == "__future__" for s in lines[index]):
        index += 1
    for position, line in enumerate(lines):
        if any(isinstance(s, (*_DEFS, ast.ClassDef)) for s in line):
            break
        if all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in line):
            index = position + 1
    return (lines[index - 1][-1], True) if index else (lines[0][0], False)


def _helpers_fix(code: str, after: bool):
    """A fix of the anchor statement: the anchor and the helpers' `code`, two blank lines between."""

    def fix(updated: cst.BaseStatement):
        new = _helper_statements(code)
        return cst.FlattenSentinel([updated, *new] if after else [*new, updated])

    return fix


@functools.cache
def _helper_statements(code: str) -> tuple[cst.BaseStatement, ...]:
    """The helpers' statements, parsed once per process (libcst nodes are immutable)."""
    new = list(cst.parse_module(code).body)
    blank = cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(""))
    new[0] = new[0].with_changes(leading_lines=[blank, blank])
    return tuple(new)


def _runs_as_script(tree: ast.Module) -> bool:
    """Whether the file has an `if __name__ == "__main__":` block: run as `python pkg/train.py` it has no
    package to import relatively from, so it keeps its helpers in itself."""
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and len(stmt.test.comparators) == 1:
            sides = [stmt.test.left, stmt.test.comparators[0]]
            if any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
                isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
            ):
                return True
    return False


def _imported_from_any_level(tree: ast.Module) -> list[str]:
    """Names imported from a helper module of any package level (a file migrated in another layout)."""
    return [
        alias.asname or alias.name
        for stmt in tree.body
        if isinstance(stmt, ast.ImportFrom) and stmt.level and stmt.module == MODULE
        for alias in stmt.names
    ]


def _import_statement(module: str, names: list[str], width: int) -> str:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= width:
        return line + "\n"
    return f"from {module} import (\n" + "".join(f"    {name},\n" for name in names) + ")\n"


def _import_fix(code: str, after: bool):
    """A fix of the anchor statement: the helpers' import next to it."""

    def fix(updated: cst.BaseStatement):
        new = cst.parse_statement(code)
        return cst.FlattenSentinel([updated, new] if after else [new, updated])

    return fix


def _replace_fix(code: str):
    """A fix of the helper module's import: the import of every name the file needs."""

    def fix(updated: cst.BaseStatement):
        return cst.parse_statement(code).with_changes(leading_lines=updated.leading_lines)

    return fix


@functools.cache
def _own_helpers() -> frozenset[str]:
    """Every name a helper template defines."""
    return frozenset(
        stmt.name
        for template in HELPER_NAMES
        for stmt in ast.parse(rendered(template)).body
        if isinstance(stmt, (*_DEFS, ast.ClassDef))
    )


def _kernel_helpers(code: str, template: str) -> list[str]:
    """The kernel functions a branch's `code` calls. A branch never names `torch_npu` itself: TorchScript
    compiles the branch, and only a `@torch.jit.unused` kernel function can hold that name."""
    if any(isinstance(node, ast.Name) and node.id == "torch_npu" for node in ast.walk(ast.parse(code))):
        raise ValueError(f"{template} calls torch_npu directly: call its kernel function `_npu_<kernel>(...)`")
    return kernels_called(code)


def _imports_torch_npu(tree: ast.Module) -> bool:
    """Whether the file imports torch_npu at module level, unguarded."""
    return any(
        isinstance(stmt, ast.Import) and any(a.name == "torch_npu" and a.asname is None for a in stmt.names)
        for stmt in tree.body
    )


def _insert_branch(updated: cst.FunctionDef, branch: cst.BaseStatement) -> cst.FunctionDef:
    body = list(updated.body.body)
    first = body[0] if body else None
    docstring = (
        isinstance(first, cst.SimpleStatementLine)
        and len(first.body) == 1
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
    body.insert(1 if docstring else 0, branch)
    return updated.with_changes(body=updated.body.with_changes(body=body))


class FusedOpsChecker(TreeChecker):
    rules = tuple({idiom.rule.id: idiom.rule for idiom in IDIOMS}.values())
    markers = tuple(dict.fromkeys(marker for idiom in IDIOMS for marker in idiom.markers))

    @classmethod
    def wants_words(cls, words) -> bool:
        # Words of the text, not substrings ("sin" is in "using"): rules out 60% of transformers without
        # an `ast`.
        return any(idiom.uses_identifiers(words.__contains__) for idiom in IDIOMS)

    @classmethod
    def wants(cls, index) -> bool:
        return any(idiom.uses_identifiers(index.uses) for idiom in IDIOMS)

    def check(self, tree: ast.Module, source: Source, index: AstIndex) -> list[TreeReport]:
        self.source = source
        self.names = index.names
        names = Names.of(tree)
        self.bindings = names.bindings
        self._qualname = names.resolve
        self.functions = _ModuleFunctions(tree)
        self.reports: list[TreeReport] = []
        #: Per rewrite: the helper templates it needs, those its own code calls, and its report.
        self.applied: list[tuple[list[str], list[str], TreeReport]] = []
        # A call an idiom rewrites in place resolves to a name whose last part is an identifier of the
        # file; most files looked at for the other idioms have none, and walking every expression is dear.
        self._scan_calls = any(
            idiom.rule.id in self.enabled and index.uses(name.rsplit(".", 1)[-1]) for name, idiom in CALL_IDIOMS.items()
        )
        self._walk(tree.body, owner=None)
        self._prelude(tree)
        return self.reports

    # -- the walk: defs with their class, and calls ---------------------------------------------------

    def _walk(self, nodes: list[ast.stmt], owner: ast.ClassDef | None) -> None:
        for node in nodes:
            # The expressions of the statement itself (a def's decorators and defaults, a class's bases),
            # then its blocks.
            if self._scan_calls:
                self._calls(
                    [
                        c
                        for c in ast.iter_child_nodes(node)
                        if not isinstance(c, (ast.stmt, ast.ExceptHandler, ast.match_case))
                    ]
                    + [h.type for h in getattr(node, "handlers", ()) if h.type is not None]
                    + [c.guard for c in getattr(node, "cases", ()) if c.guard is not None],
                )
            if isinstance(node, ast.ClassDef):
                self._walk(node.body, owner=node)
            elif isinstance(node, _DEFS) and node.name.startswith("_") and node.name in _own_helpers():
                continue  # our helpers call SDPA and the kernels themselves
            elif isinstance(node, _DEFS):
                self._function(node, owner)
                self._walk(node.body, owner=None)
            else:
                blocks = [getattr(node, a, None) for a in ("body", "orelse", "finalbody")]
                blocks += [h.body for h in getattr(node, "handlers", ())] + [c.body for c in getattr(node, "cases", ())]
                self._walk([s for block in blocks if isinstance(block, list) for s in block], owner)

    def _calls(self, nodes) -> None:
        for root in nodes:
            for node in ast.walk(root):
                if isinstance(node, ast.Call):
                    self._call(node)

    # -- matching --------------------------------------------------------------------------------------

    def _function(self, node: ast.FunctionDef, owner: ast.ClassDef | None) -> None:
        # A method may spell the idiom through its siblings (`self._norm(x)`): look at the whole class.
        scope = self.source.segment(owner if owner is not None else node)
        idioms = [i for i in IDIOMS if i.rule.id in self.enabled and any(k in scope for k in i.markers)]
        if not idioms or has_fused_branch(node):
            return
        siblings = {s.name: s for s in owner.body if isinstance(s, _DEFS)} if owner is not None else {}
        fn = Function(node, owner is not None, self._qualname, siblings, self.functions, self.api, self.names)
        for idiom in idioms:
            outcome = idiom.match(fn)
            if outcome is not None:
                self._decide(node, outcome)
                return

    def _call(self, node: ast.Call) -> None:
        name = self._qualname(node.func)
        idiom = CALL_IDIOMS.get(name)
        if idiom is None or idiom.rule.id not in self.enabled:
            return
        outcome = idiom.match_call(name, self.api, self.names)
        if outcome is None:
            return
        function = name.rsplit(".", 1)[-1]
        if outcome.template is not None and self.bindings.get("torch") != "torch":
            outcome.message = (
                f"{function} not fused: the file does not `import torch` at module level, which the wrapper uses"
            )
            outcome.template = None
        self._decide(node, outcome, fix=idiom.wrap_call)

    def _decide(self, node: ast.FunctionDef | ast.Call, outcome: Outcome, fix=None) -> None:
        if outcome.template is not None and self.bindings.get("torch") != "torch":
            outcome.message += " not injected: the file does not `import torch` at module level, which the branch uses"
            outcome.template = None
        if outcome.template is not None and isinstance(node, _DEFS) and not self.source.starts_line(node.body[0]):
            outcome.message += " not injected: the function body is on the `def` line"
            outcome.template = None
        if outcome.template is None:
            self.reports.append(TreeReport(outcome.rule, node, outcome.message))
            return
        helpers = with_kernels(list(outcome.helpers))
        called = list(outcome.helpers)  # the helpers the file's own code calls
        if fix is None:
            from npu_migrate.templating import render  # jinja2 costs 30 ms of start-up; most runs never render

            code = self._laid_out(node, render(outcome.template, **outcome.context))
            kernels = _kernel_helpers(code, outcome.template)
            helpers += kernels
            called += [PRELUDE, *kernels]
            branch = cst.parse_statement(code)
            fix = lambda updated: _insert_branch(updated, branch)  # noqa: E731
        self.reports.append(TreeReport(outcome.rule, node, outcome.message, fix=fix))
        self.applied.append((helpers, called, self.reports[-1]))

    def _laid_out(self, node: ast.FunctionDef, code: str) -> str:
        """A branch's `code` (one statement a line, at column 0) within the file's width once indented as
        the function's body, which it is inserted in, and in the file's indentation unit."""
        body = self.source.lines[node.body[0].lineno - 1]
        margin = body[: len(body) - len(body.lstrip(" \t"))]
        header = self.source.lines[node.lineno - 1]
        unit = margin[len(header) - len(header.lstrip(" \t")) :] or "    "
        return fit(code, line_width(self.source.text) - len(margin), unit)

    # -- the prelude -----------------------------------------------------------------------------------

    def _prelude(self, tree: ast.Module) -> None:
        if not self.applied:
            return
        if self.source.helper_module is not None and not _runs_as_script(tree):
            self._import_helpers(tree, self.source.helper_module)
            return
        templates = [PRELUDE, *dict.fromkeys(h for helpers, _, _ in self.applied for h in helpers)]
        kernels = set(kernel_templates().values())
        templates.sort(key=lambda t: (t != PRELUDE, t not in kernels))  # stable: the rest in order of use
        existing = defined_names(tree) | set(_imported_from_any_level(tree))
        missing = [t for t in templates if HELPER_NAMES[t] not in existing]
        if missing:
            names = ", ".join(f"`{HELPER_NAMES[t]}`" for t in missing)
            # One import policy: a file that imports torch_npu unconditionally (it calls torch.npu APIs, so
            # cannot run without it) keeps that one import; otherwise the helpers import it guarded.
            guarded = PRELUDE in missing and not _imports_torch_npu(tree)
            what = " (and a guarded `import torch_npu`)" if guarded else ""
            anchor, after = _prelude_anchor(tree)
            self.reports.append(
                TreeReport(
                    self.applied[0][2].rule,
                    tree,
                    f"fused-op helpers {names}{what} added after the imports",
                    fix=_helpers_fix(helper_code(missing, guarded), after),
                    target=anchor,
                    serves=tuple(report for *_, report in self.applied),
                    # Not a site of the idiom: analyze's affinity report counts sites, not this.
                    data={"fused": "helpers"},
                )
            )

    def _import_helpers(self, tree: ast.Module, module: str) -> None:
        """A file of a package imports the helpers its branches call from the package's helper module,
        which the driver writes once for all of them (`npu_migrate.helper_modules`)."""
        called = dict.fromkeys(t for _, names, _ in self.applied for t in names)
        existing = defined_names(tree) | set(_imported_from_any_level(tree))
        missing = [HELPER_NAMES[t] for t in called if HELPER_NAMES[t] not in existing]
        if not missing:
            return
        present = [s for s in tree.body if isinstance(s, ast.ImportFrom) and "." * s.level + (s.module or "") == module]
        names = sorted({*imported_helpers(tree, module), *missing})
        code = _import_statement(module, names, line_width(self.source.text))
        if present:
            target, fix = present[0], _replace_fix(code)
        else:
            target, after = _prelude_anchor(tree)
            fix = _import_fix(code, after)
        listed = ", ".join(f"`{name}`" for name in missing)
        self.reports.append(
            TreeReport(
                self.applied[0][2].rule,
                tree,
                f"fused-op helpers {listed} imported from `{module}`, the package's helper module",
                fix=fix,
                target=target,
                serves=tuple(report for *_, report in self.applied),
                data={"fused": "helpers"},
            )
        )
