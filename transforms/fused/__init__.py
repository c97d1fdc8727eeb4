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
the package's helper module instead, which the driver writes once (`npu_migrate.output.helper_module`), as
far up as the file's own relative imports prove it is imported in a package (`proven_module`); a script
folder's file whose folder its siblings' imports prove on sys.path imports it from beside it
(`from _npu_fused import ...`, `packages.sibling_modules`). Off an NPU nothing changes, bit for bit.
TorchScript, FX and torch.compile keep
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
by name. A helper present is never rewritten (a reviewer's edits stay): one that differs from what this
version writes (an older release's) is reported, and a deleted one that the file's code calls is written
again, which is how a user takes this version's.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import re
from collections.abc import Iterable, Mapping

import libcst as cst

from npu_migrate.engine.astindex import AstIndex
from npu_migrate.engine.checkers import TreeChecker
from npu_migrate.engine.layout import fit, line_width
from npu_migrate.engine.lines import LINE_BREAK
from npu_migrate.engine.rule import Rule
from npu_migrate.engine.scoped import Source, TreeReport
from npu_migrate.program.names import Names
from npu_migrate.program.packages import MODULE, is_sibling, usable_module
from npu_migrate.transforms.common.guarded_import import is_guarded_import
from npu_migrate.transforms.fused import optional_imports
from npu_migrate.transforms.fused.helpers import (
    CAUSAL_MASK,
    PRELUDE,
    defined_name,
    defined_names,
    definition_key,
    definitions,
    helper_code,
    imported_helpers,
    kernel_function,
    kernel_templates,
    kernels_called,
    names_in,
    names_in_template,
    parse_typed,
    rendered,
)
from npu_migrate.transforms.fused.idiom import Idiom
from npu_migrate.transforms.fused.imported import Scope, declared_global
from npu_migrate.transforms.fused.symbolic import (
    IN_PLACE_BLOCKS,
    Function,
    Outcome,
    brief,
    forget_statements,
    has_fused_branch,
)


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
    # The helpers of no one idiom: the prelude, the kernel functions, the causal mask attention helpers share.
    names = {PRELUDE: "_is_npu", CAUSAL_MASK: "_npu_causal_mask"}
    names.update({template: name for name, template in kernel_templates().items()})
    for idiom in idioms:
        for template, name in idiom.helpers.items():
            if names.setdefault(template, name) != name:
                raise ValueError(f"helper template {template} declared as defining {names[template]} and {name}")
    return names


IDIOMS = _idioms()
#: The module-level definition each helper template provides: present means already inserted.
HELPER_NAMES = _helper_names(IDIOMS)
#: Qualified name of a function whose calls an idiom rewrites in place -> those idioms, the higher rule id
#: first: of those selected, the first decides (NPU707's opt-in SDPA wrapper over NPU704's native report).
CALL_IDIOMS: dict[str, tuple[Idiom, ...]] = {}
for _idiom in reversed(IDIOMS):
    for _name in _idiom.calls:
        CALL_IDIOMS[_name] = (*CALL_IDIOMS.get(_name, ()), _idiom)
del _idiom, _name
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


def _dotted_root(node: ast.expr) -> ast.Name | None:
    """The Name a Name/Attribute chain (`a.b.c`) starts with, else None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node if isinstance(node, ast.Name) else None


#: In the text of every file that holds a block of helpers (`_is_npu` is the prelude's).
_HELPERS_MARKER = "def _is_npu("


class _ModuleFunctions(Mapping):
    """The module-level defs a fused idiom may call (`rotate_half`). A name the module defines twice or
    also binds otherwise is left out: which definition a call reaches is unknown."""

    def __init__(self, tree: ast.Module, declared: set[str] = frozenset()) -> None:
        defs: dict[str, ast.FunctionDef] = {}
        rebound: set[str] = set(declared)  # `global name` in a function: it may assign one
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
            # `from X import *` may rebind any def before it (what X defines is not read): a call reaches
            # the last binding (as `imported._bindings`).
            if isinstance(stmt, (ast.ImportFrom, *_BLOCKS)) and any(
                isinstance(n, ast.ImportFrom) and n.names[0].name == "*" for n in ast.walk(stmt)
            ):
                rebound.update(defs)
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


def _with_line_breaks(code: str, text: str) -> str:
    """`code` with the file's line break: libcst writes the statements' own with the file's, but a
    docstring of several lines keeps the ones it was parsed with."""
    found = LINE_BREAK.search(text)
    return code if found is None or found.group() == "\n" else code.replace("\n", found.group())


@functools.cache
def _helper_statements(code: str) -> tuple[cst.BaseStatement, ...]:
    """The helpers' statements, parsed once per process (libcst nodes are immutable)."""
    new = list(cst.parse_module(code).body)
    blank = cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(""))
    new[0] = new[0].with_changes(leading_lines=[blank, blank])
    return tuple(new)


def _imported_from_any_level(tree: ast.Module) -> list[str]:
    """Names imported from a helper module of any package level, or a sibling one (a file migrated in
    another layout)."""
    return [
        alias.asname or alias.name
        for stmt in tree.body
        if isinstance(stmt, ast.ImportFrom) and stmt.module == MODULE
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
def helper_definitions() -> dict[str, frozenset[str]]:
    """Every module-level name a helper template defines -> its definitions as this version writes it
    (`definition_key`; `_is_npu` has two, for a file that imports torch_npu and one that may not): a copy
    that differs is an older release's, or edited."""
    found: dict[str, set[str]] = {}
    for template in HELPER_NAMES:
        for imported in (False, True):
            for name, stmt in definitions(parse_typed(rendered(template, torch_npu_imported=imported))).items():
                found.setdefault(name, set()).add(definition_key(stmt))
    return {name: frozenset(keys) for name, keys in found.items()}


@functools.cache
def helper_groups() -> dict[str, tuple[str, ...]]:
    """Every module-level name a helper template defines -> every name its template defines: they are
    written together, and so must be deleted together to be written again."""
    return {
        name: tuple(names)
        for template in HELPER_NAMES
        for names in [list(definitions(ast.parse(rendered(template))))]
        for name in names
    }


@functools.cache
def helper_rules() -> dict[str, Rule]:
    """Every module-level name a helper template defines -> the rule a finding about it is reported under:
    that of the first idiom, in rule-id order, whose rewrites write it (`_is_npu`: every idiom's)."""
    found: dict[str, Rule] = {}
    for idiom in IDIOMS:
        kernels = [kernel_templates().get(kernel_function(kernel)) for kernel in idiom.kernels]
        templates = [PRELUDE, *with_called_helpers([*idiom.helpers, *filter(None, kernels)])]
        for template in templates:
            for name in definitions(ast.parse(rendered(template))):
                found.setdefault(name, idiom.rule)
    return found


def is_helper(stmt: ast.stmt) -> bool:
    """Whether the module-level `stmt` (parsed by `parse_typed`) defines a helper as this version writes it."""
    name = defined_name(stmt)
    return name in helper_definitions() and definition_key(stmt) in helper_definitions()[name]


def _kernel_helpers(code: str, template: str) -> list[str]:
    """The kernel functions a branch's `code` calls. A branch never names `torch_npu` itself: TorchScript
    compiles the branch, and only a `@torch.jit.unused` kernel function can hold that name."""
    if any(isinstance(node, ast.Name) and node.id == "torch_npu" for node in ast.walk(ast.parse(code))):
        raise ValueError(f"{template} calls torch_npu directly: call its kernel function `_npu_<kernel>(...)`")
    return kernels_called(code)


def _imports_torch_npu(tree: ast.Module, guarded: bool = True) -> bool:
    """Whether the file imports torch_npu at module level: unguarded, or (`guarded`) guarded in the
    prelude's words (the portable target's `import torch_npu`)."""
    return any(
        (isinstance(stmt, ast.Import) and any(a.name == "torch_npu" and a.asname is None for a in stmt.names))
        or (guarded and is_guarded_import(stmt))
        for stmt in tree.body
    )


def _own_line(indent: str) -> cst.ParenthesizedWhitespace:
    """A line break inside brackets, then the enclosing block's indentation and `indent` more."""
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), indent=True, last_line=cst.SimpleWhitespace(indent)
    )


def _one_a_line(call: cst.Call) -> cst.Call:
    """An argument `call` (itself one argument a line) with its own arguments one a line, indented once more."""
    args = [
        arg.with_changes(
            comma=cst.Comma(whitespace_after=_own_line("    " if position == len(call.args) - 1 else "        ")),
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
        for position, arg in enumerate(call.args)
    ]
    return call.with_changes(whitespace_before_args=_own_line("        "), args=args)


def _statement_index(statements: list[ast.stmt], statement: ast.stmt, starts_line) -> int:
    """The position of `statement` of the block `statements` (one that starts its line) among libcst's
    statements, where simple statements joined by `;` are one: those before it that start a line (a
    statement after `x = f(\n    y); ` shares the line the one before it ends on)."""
    return sum(1 for s in statements[: next(i for i, s in enumerate(statements) if s is statement)] if starts_line(s))


def with_called_helpers(templates) -> list[str]:
    """`templates` and the helpers and kernel functions their code calls, at any depth, each once: one
    not among `templates` goes in front of the first that calls it (`_npu_fusion_sdpa` calls
    `_npu_causal_mask`), the rest stay in order. The prelude, which every helper calls, is not added:
    it goes first, where the helpers go."""
    by_name = {name: template for template, name in HELPER_NAMES.items() if template != PRELUDE}
    found = list(dict.fromkeys(templates))
    index = 0
    while index < len(found):
        called = (by_name.get(name) for name in sorted(names_in_template(found[index])))
        missing = list(dict.fromkeys(t for t in called if t is not None and t not in found))
        found[index:index] = missing  # then looks at what those call
        if not missing:
            index += 1
    return found


def _entry_helpers(templates: tuple[str, ...]) -> list[str]:
    """Of the helper `templates`, those no other of them calls."""
    inner = {name for t in templates for name in names_in_template(t) if HELPER_NAMES.get(t) != name}
    return [t for t in templates if HELPER_NAMES[t] not in inner]


def _insert_branch(updated: cst.FunctionDef, branch: cst.BaseStatement, index: int | None = None) -> cst.FunctionDef:
    """The function with `branch` first in its body (after the docstring), or in front of statement `index`."""
    body = list(updated.body.body)
    if index is None:
        first = body[0] if body else None
        docstring = (
            isinstance(first, cst.SimpleStatementLine)
            and len(first.body) == 1
            and isinstance(first.body[0], cst.Expr)
            and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        )
        body.insert(1 if docstring else 0, branch)
    else:
        body = _in_front(body, index, branch)
    return updated.with_changes(body=updated.body.with_changes(body=body))


def _in_front(block: list[cst.BaseStatement], index: int, branch: cst.BaseStatement) -> list[cst.BaseStatement]:
    """`block` with `branch` in front of its statement `index`: the blank lines above the statement go
    above the branch; its comments stay with it."""
    block = list(block)
    leading = list(block[index].leading_lines)
    blanks = 0
    while blanks < len(leading) and leading[blanks].comment is None:
        blanks += 1
    block[index] = block[index].with_changes(leading_lines=leading[blanks:])
    block.insert(index, branch.with_changes(leading_lines=leading[:blanks]))
    return block


def _insert_within(updated: cst.FunctionDef, branch: cst.BaseStatement, outer: int, index: int) -> cst.FunctionDef:
    """The function with `branch` in front of statement `index` of the block that is its statement `outer`."""
    body = list(updated.body.body)
    body[outer] = _insert_branch(body[outer], branch, index)
    return updated.with_changes(body=updated.body.with_changes(body=body))


def _branch_helpers(code: str, outcome: Outcome) -> tuple[list[str], list[str]]:
    """(the kernel functions a branch's `code` calls, every helper it calls: the prelude, the declared
    helpers it names, those kernels): what a package's file imports for it."""
    kernels = _kernel_helpers(code, outcome.template)
    named = names_in(code)
    return kernels, [PRELUDE, *(t for t in outcome.helpers if HELPER_NAMES[t] in named), *kernels]


def _steps_to(statements: list[ast.stmt], target: ast.stmt, starts_line) -> list[tuple[int, str | None]]:
    """The way from a block to `target` (which is alone on its line) in libcst's terms: (the statement's
    index among the block's statements, the field of it holding the next block) ..., then (its index, None)."""
    for stmt in statements:
        if stmt is target:
            return [(_statement_index(statements, stmt, starts_line), None)]
        for name in IN_PLACE_BLOCKS.get(type(stmt), ()):
            try:
                rest = _steps_to(getattr(stmt, name), target, starts_line)
            except LookupError:
                continue
            return [(_statement_index(statements, stmt, starts_line), name), *rest]
    raise LookupError(target)


#: A trailing comment that tells a linter or type checker about its line (noqa, type: ignore): the fused copy
#: of the line needs it as much as the original does.
_DIRECTIVE = re.compile(r"#\s*(noqa|type:\s*ignore|pylint:|pyright:|mypy:|nosec)")


def _with_directive(branch: cst.If, original: cst.BaseStatement) -> cst.If:
    """`branch` whose fused statement carries `original`'s directive comment, if it has one."""
    comment = getattr(getattr(original, "trailing_whitespace", None), "comment", None)
    if comment is None or not _DIRECTIVE.match(comment.value):
        return branch
    (fused, *rest) = branch.body.body
    whitespace = fused.trailing_whitespace.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=comment)
    return branch.with_changes(
        body=branch.body.with_changes(body=[fused.with_changes(trailing_whitespace=whitespace), *rest])
    )


def _replace_in_place(updated: cst.FunctionDef, replacements) -> cst.FunctionDef:
    """The function with each run of statements `replacements` lead to (the way to its first, how many)
    replaced by its branch, the statements themselves (their comments kept) put where the branch's `else:`
    holds `pass`, or, for a branch with no `else:` (a `return`), with the branch in front of them."""

    def replaced(block, steps, count, branch) -> list[cst.BaseStatement]:
        (index, name), rest = steps[0], steps[1:]
        block = list(block)
        stmt = block[index]
        if name is None and branch.orelse is None:  # a `return`: the branch goes in front of it
            return _in_front(block, index, _with_directive(branch, stmt))
        if name is None:
            run = block[index : index + count]
            branch = _with_directive(branch, run[-1])
            orelse = branch.orelse
            fallback = orelse.body.with_changes(body=[run[0].with_changes(leading_lines=()), *run[1:]])
            block[index : index + count] = [
                branch.with_changes(leading_lines=stmt.leading_lines, orelse=orelse.with_changes(body=fallback))
            ]
        elif name == "body":
            inner = replaced(stmt.body.body, rest, count, branch)
            block[index] = stmt.with_changes(body=stmt.body.with_changes(body=inner))
        elif isinstance(getattr(stmt, name), cst.If):  # an `elif`: the one statement of ast's `orelse`
            block[index] = stmt.with_changes(orelse=replaced([stmt.orelse], rest, count, branch)[0])
        else:  # `else:` / `finally:`
            part = getattr(stmt, name)
            inner = part.body.with_changes(body=replaced(part.body.body, rest, count, branch))
            block[index] = stmt.with_changes(**{name: part.with_changes(body=inner)})
        return block

    # The last first: a branch changes how many statements its block holds after it.
    for steps, count, branch in sorted(replacements, key=lambda r: [index for index, _ in r[0]], reverse=True):
        body = replaced(updated.body.body, steps, count, branch)
        updated = updated.with_changes(body=updated.body.with_changes(body=body))
    return updated


class FusedOpsChecker(TreeChecker):
    rules = tuple({idiom.rule.id: idiom.rule for idiom in IDIOMS}.values())
    # A file holding the helpers (a package's helper module, a migrated file) is looked at for them: one
    # that differs from what this version writes is reported (`_stale_helpers`). Every block of helpers
    # defines `_is_npu`, which reads `torch_npu` (the start-up gate's marker).
    markers = (*dict.fromkeys(marker for idiom in IDIOMS for marker in idiom.markers), "torch_npu")

    @classmethod
    def wants_words(cls, words) -> bool:
        # Words of the text, not substrings ("sin" is in "using"): rules out 60% of transformers without
        # an `ast`.
        return any(idiom.uses_identifiers(words.__contains__) for idiom in IDIOMS) or "_is_npu" in words

    @classmethod
    def wants(cls, index) -> bool:
        return any(idiom.uses_identifiers(index.uses) for idiom in IDIOMS) or index.uses("_is_npu")

    def check(self, tree: ast.Module, source: Source, index: AstIndex) -> list[TreeReport]:
        forget_statements()  # the previous file's statements: its tree would stay alive in the caches
        self.source = source
        self.tree = tree
        self.names = index.names
        names = Names.of(tree)
        self.bindings = names.bindings
        self.shadowed = names.shadowed
        self.alternatives = names.alternatives
        self._qualname = names.resolve
        # Names a function declares `global` may be rebound by it (the walk only where the word is written).
        declared = declared_global(tree) if "global" in source.text else frozenset()
        self.functions = _ModuleFunctions(tree, declared)
        # Helpers imported from sibling modules, read only when an idiom follows one (NPU703).
        self.imported = Scope(tree, getattr(source, "file", None), declared=declared)
        self.reports: list[TreeReport] = []
        #: Per rewrite: the helper templates it needs, those its own code calls, and its report.
        self.applied: list[tuple[list[str], list[str], TreeReport]] = []
        # A call an idiom rewrites in place resolves to a name whose last part is an identifier of the
        # file; most files looked at for the other idioms have none, and walking every expression is dear.
        self._scan_calls = any(
            index.uses(name.rsplit(".", 1)[-1]) and any(i.rule.id in self.enabled for i in idioms)
            for name, idioms in CALL_IDIOMS.items()
        )
        self._guards: list[ast.expr] = []  # the tests of the `if`s, in the function, whose body is walked
        #: Modules the wrapped calls read their function from that are None where the package is absent:
        #: `import flash_attn` made conditional (`optional_imports`), `xops` of a try-import (`xops = None`).
        self.optional_modules: set[str] = set()
        self._walk(tree.body, owner=None)
        self._optional_imports(tree)
        self._prelude(tree)
        if _HELPERS_MARKER in source.text:
            self._stale_helpers(tree)
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
            if (
                isinstance(node, (*_DEFS, ast.ClassDef))
                and node.name.startswith("_")
                and node.name in helper_definitions()
            ):
                continue  # our helpers call SDPA and the kernels themselves
            if isinstance(node, ast.ClassDef):
                self._walk(node.body, owner=node)
            elif isinstance(node, _DEFS):
                self._function(node, owner)
                enclosing, self._guards = self._guards, []
                self._walk(node.body, owner=None)
                self._guards = enclosing
            elif isinstance(node, ast.If):
                self._guards.append(node.test)
                self._walk(node.body, owner)
                self._guards.pop()
                self._walk(node.orelse, owner)
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
        # A staticmethod's first parameter is no instance (torchtitan's `apply_rotary_emb(query, key, cache)`).
        method = owner is not None and not any(
            isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list
        )
        fn = Function(node, method, self._qualname, siblings, self.functions, self.api, self.names)
        fn.imported = self.imported
        fn.class_name = owner.name if owner is not None else None
        fn.owner, fn.module = owner, self.tree
        for idiom in idioms:
            outcome = idiom.match(fn)
            if outcome is not None:
                self._decide(node, outcome)
                # A declined idiom does not hide the next one: attention with a rotary embedding inside is
                # reported (or fused) as attention too. A branch is the function's one rewrite.
                if outcome.template is not None:
                    return

    def _call(self, node: ast.Call) -> None:
        name = self._qualname(node.func)
        root = _dotted_root(node.func)
        if name is None and root is not None and root.id in self.shadowed:
            # A name (or, `xops.memory_efficient_attention`, the module it is read from) that a try-import
            # binds and its `except` rebinds (`xops = None`).
            rest = ast.unparse(node.func)[len(root.id) :]
            name = self.shadowed[root.id] + rest
            if all(i.optional_package is None for i in CALL_IDIOMS.get(name, ())):
                return
            if rest:
                # The module may be None there (`xops = None`): the wrapped call reads `xops and xops.f`.
                self.optional_modules.add(root.id)
            bound = sorted({t + rest for t in self.alternatives.get(root.id, ()) if t + rest in CALL_IDIOMS})
            if len({t.rsplit(".", 1)[-1] for t in bound}) > 1:
                # A version-dependent try chain (`flash_attn_unpadded_func as flash_attn_varlen_func`): the
                # kernels differ in causal alignment and arguments, and which one runs is only known there.
                idiom = next((i for i in CALL_IDIOMS[name] if i.rule.id in self.enabled), None)
                if idiom is not None:
                    either = " or ".join(f"`{t.rsplit('.', 1)[-1]}`" for t in bound)
                    message = (
                        f"`{ast.unparse(node.func)}` not fused: the imports bind it to {either}, whichever imports, "
                        "and their causal alignment and arguments differ; to fuse it, call each by its own name"
                    )
                    self._decide(node, Outcome(idiom.rule, message))
                return
        idiom = next((i for i in CALL_IDIOMS.get(name, ()) if i.rule.id in self.enabled), None)
        if idiom is None:
            return
        resolving = {"resolve": self._optional_qualname} if idiom.resolves_arguments else {}
        outcome = idiom.match_call(name, self.api, self.names, node, tuple(self._guards), **resolving)
        if outcome is None:
            return
        function = name.rsplit(".", 1)[-1]
        if outcome.template is not None and self.bindings.get("torch") != "torch":
            outcome.message = (
                f"{function} not fused: the file does not `import torch` at module level, which the wrapper uses"
            )
            outcome.template = None
            outcome.remedy = "to fuse it, add `import torch` at module level"
        context, laid_out = outcome.context, self._call_layout(node)
        if idiom.optional_package is not None:
            # Filled by `_optional_imports`, read when the fix runs: the modules imported conditionally.
            context = {**context, "optional": self.optional_modules}
        self._decide(node, outcome, fix=lambda call: laid_out(idiom.wrap_call(call, **context)))

    def _optional_qualname(self, node: ast.expr) -> str | None:
        """The qualified name of a Name/Attribute chain of a call's arguments, read through a trusted import
        or a try-import that its `except` rebinds (`xops.LowerTriangularMask`, `xops = None` there)."""
        name = self._qualname(node)
        root = _dotted_root(node)
        if name is None and root is not None and root.id in self.shadowed:
            name = self.shadowed[root.id] + ast.unparse(node)[len(root.id) :]
        return name

    def _call_layout(self, node: ast.Call):
        """A fix of the renamed call that keeps it within the file's width: its arguments on a line of their
        own, or one a line, black's way, and the arguments of one that is itself a call too wide for its
        line (xformers' bias read at the call) one a line too. A call on several lines that still fits
        keeps its layout."""
        line = self.source.lines[node.lineno - 1]
        margin = line[: len(line) - len(line.lstrip(" \t"))]
        before, after = len(line[: node.col_offset]), len(line) - node.end_col_offset
        width = line_width(self.source.text)
        several = node.end_lineno != node.lineno

        def fits(call: cst.Call) -> bool:
            lines = cst.Module([]).code_for_node(call).split("\n")
            if several:  # the lines after the first carry their indentation relative to the block's
                return before + len(lines[0]) <= width and all(len(margin) + len(rest) <= width for rest in lines[1:])
            return before + len(lines[0]) + after <= max(width, len(line))  # fits, or no wider than it was

        def laid_out(call: cst.Call) -> cst.Call:
            if fits(call):
                return call
            inner = margin + "    "
            flat = ", ".join(
                cst.Module([]).code_for_node(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for a in call.args
            )
            one_line = len(inner) + len(flat) <= width and not several
            args = []
            for position, arg in enumerate(call.args):
                last = position == len(call.args) - 1
                if one_line:
                    comma = cst.MaybeSentinel.DEFAULT if last else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                    trailing = _own_line("") if last else cst.SimpleWhitespace("")
                else:
                    comma = cst.Comma(whitespace_after=_own_line("" if last else "    "))
                    trailing = cst.SimpleWhitespace("")
                    code = cst.Module([]).code_for_node(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))
                    if len(inner) + len(code) + 1 > width and isinstance(arg.value, cst.Call) and arg.value.args:
                        arg = arg.with_changes(value=_one_a_line(arg.value))
                args.append(arg.with_changes(comma=comma, whitespace_after_arg=trailing))
            return call.with_changes(whitespace_before_args=_own_line("    "), args=args)

        return laid_out

    def _decide(self, node: ast.FunctionDef | ast.Call, outcome: Outcome, fix=None) -> None:
        if outcome.template is not None and self.bindings.get("torch") != "torch":
            outcome.message += " not injected: the file does not `import torch` at module level, which the branch uses"
            outcome.template = None
            outcome.remedy = "to fuse it, add `import torch` at module level"
        if outcome.template is not None and isinstance(node, _DEFS):
            before = outcome.before or node.body[0]
            if not self.source.starts_line(before):
                where = (
                    "the function body is on the `def` line"
                    if before is node.body[0]
                    else "a statement shares its line"
                )
                outcome.message += f" not injected: {where}"
                outcome.template = None
                outcome.remedy = "to fuse it, put each statement of the body on its own line"
        if outcome.template is not None and any(
            not self._alone_on_its_line(stmt) for run, _ in outcome.in_place for stmt in run
        ):
            outcome.message += " not injected: a statement shares its line"
            outcome.template = None
            outcome.remedy = "to fuse it, put each statement of the body on its own line"
        if outcome.template is None:
            if outcome.remedy:
                outcome.message += f"; {outcome.remedy}"
            if outcome.per_file and any(r.message == brief(outcome.message) for r in self.reports):
                return  # diffusers' attention processors: 32 calls, one reason
            self.reports.append(TreeReport(outcome.rule, node, brief(outcome.message), data=outcome.data or None))
            return
        helpers = with_called_helpers(outcome.helpers)
        # The helpers the file's own code calls (what a package's file imports): a renamed call calls the
        # declared helpers that no other declared helper calls (`_npu_sdpa`, not the `_npu_fusion_sdpa`
        # it calls); a branch, those its code names.
        called = _entry_helpers(outcome.helpers)
        if fix is None and outcome.in_place:
            from npu_migrate.engine.templating import render

            replacements, codes = [], []
            for run, context in outcome.in_place:
                # No room is kept for the linter comment the fused statement carries over (`_with_directive`):
                # line-length checks (ruff's E501, pycodestyle's) leave such pragmas out of the count.
                codes.append(self._laid_out(node, render(outcome.template, **context), at=run[0]))
                steps = _steps_to(node.body, run[0], self.source.starts_line)
                replacements.append((steps, len(run), cst.parse_statement(codes[-1])))
            code = "\n".join(codes)
            kernels, called = _branch_helpers(code, outcome)
            helpers += kernels
            fix = lambda updated: _replace_in_place(updated, replacements)  # noqa: E731
        elif fix is None:
            from npu_migrate.engine.templating import render  # jinja2 costs 30 ms of start-up; most runs never render

            # A branch may go first inside a top-level block (NPU703: an autocast-disabled `with`).
            block = next((b for b in node.body if outcome.before in getattr(b, "body", ())), None)
            code = self._laid_out(node, render(outcome.template, **outcome.context), block is not None)
            kernels, called = _branch_helpers(code, outcome)
            helpers += kernels
            branch = cst.parse_statement(code)
            starts = self.source.starts_line
            index = None if outcome.before is None else _statement_index((block or node).body, outcome.before, starts)
            if block is not None:
                outer = _statement_index(node.body, block, starts)
                fix = lambda updated: _insert_within(updated, branch, outer, index)  # noqa: E731
            else:
                fix = lambda updated: _insert_branch(updated, branch, index)  # noqa: E731
        self.reports.append(TreeReport(outcome.rule, node, outcome.message, fix=fix))
        self.applied.append((helpers, called, self.reports[-1]))

    def _laid_out(self, node: ast.FunctionDef, code: str, nested: bool = False, at: ast.stmt | None = None) -> str:
        """A branch's `code` (one statement a line, at column 0) within the file's width once indented as
        the function's body, which it is inserted in (`nested`: one level deeper, in a block of it; `at`: in
        place of that statement, indented as it is), and in the file's indentation unit."""
        body = self.source.lines[node.body[0].lineno - 1]
        margin = body[: len(body) - len(body.lstrip(" \t"))]
        header = self.source.lines[node.lineno - 1]
        unit = margin[len(header) - len(header.lstrip(" \t")) :] or "    "
        if at is not None:
            line = self.source.lines[at.lineno - 1]
            margin = line[: len(line) - len(line.lstrip(" \t"))]
        return fit(code, line_width(self.source.text) - len(margin) - (len(unit) if nested else 0), unit)

    def _alone_on_its_line(self, stmt: ast.stmt) -> bool:
        """Whether `stmt` starts its line and ends it: libcst holds it as a line of its own."""
        if not self.source.starts_line(stmt):
            return False
        following = self.source.lines[stmt.end_lineno - 1][stmt.end_col_offset :].lstrip()
        return not following or following.startswith("#")

    def _optional_imports(self, tree: ast.Module) -> None:
        """Imports of a package an NPU host lacks: made conditional where they only feed the calls an idiom
        wrapped, reported where an NPU host runs them otherwise."""
        for idiom in IDIOMS:
            package = idiom.optional_package
            if package is None or idiom.rule.id not in self.enabled or package not in self.names:
                continue
            wrapped = [r.node for *_, r in self.applied if r.rule is idiom.rule and isinstance(r.node, ast.Call)]
            deferred = [part for call in wrapped for part in idiom.deferred(call)] if idiom.deferred else []
            for decision in optional_imports.decide(tree, package, wrapped, self._alone, deferred):
                self.optional_modules.update(decision.modules)
                # Not a site of the idiom: analyze's affinity report counts sites, not this.
                self.reports.append(
                    TreeReport(
                        idiom.rule, decision.statement, decision.message, fix=decision.fix, data={"fused": "import"}
                    )
                )

    def _alone(self, stmt: ast.stmt) -> bool:
        """Whether no other statement shares the lines of `stmt`."""
        first, last = self.source.lines[stmt.lineno - 1], self.source.lines[stmt.end_lineno - 1]
        return not first[: stmt.col_offset].strip() and not last[stmt.end_col_offset :].split("#")[0].strip()

    # -- the prelude -----------------------------------------------------------------------------------

    def _prelude(self, tree: ast.Module) -> None:
        # A file whose code calls a helper it no longer defines (deleted, to take this version's: see
        # `_stale_helpers`) gets it back, as a file with a new rewrite gets the helpers it calls.
        called = _helpers_called(tree) if _reads_helpers(self.names) else set()
        if not self.applied and not called:
            return
        existing = defined_names(tree) | set(_imported_from_any_level(tree))
        module = usable_module(self.source.helper_module, tree)
        if module is not None:
            self._import_helpers(tree, module, sorted(called - existing))
            return
        # With the helpers those call (`_npu_sdpa` calls `_npu_fusion_sdpa`): nothing else writes a file's own.
        # Only a missing one's: a helper the file keeps calls what its own text calls, which an older
        # release's may not (`_npu_fusion_sdpa` before `_npu_causal_mask`).
        absent = called - existing
        restored = [t for t in templates_defining(absent) if HELPER_NAMES[t] not in existing] if absent else []
        if not self.applied and not restored:
            return
        templates = [PRELUDE, *dict.fromkeys([*(h for helpers, _, _ in self.applied for h in helpers), *restored])]
        kernels = set(kernel_templates().values())
        templates.sort(key=lambda t: (t != PRELUDE, t not in kernels))  # stable: the rest in order of use
        missing = [t for t in templates if HELPER_NAMES[t] not in existing]
        if missing:
            names = ", ".join(f"`{HELPER_NAMES[t]}`" for t in missing)
            # One import policy: a file that imports torch_npu unconditionally (it calls torch.npu APIs, so
            # cannot run without it) keeps that one import; otherwise the helpers import it guarded.
            guarded = PRELUDE in missing and not _imports_torch_npu(tree)
            plain = _imports_torch_npu(tree, guarded=False)  # `_is_npu` then need not test `torch_npu is None`
            what = " (and a guarded `import torch_npu`)" if guarded else ""
            anchor, after = _prelude_anchor(tree)
            self.reports.append(
                TreeReport(
                    self._helpers_rule(missing),
                    tree,
                    f"fused-op helpers {names}{what} added after the imports",
                    fix=_helpers_fix(_with_line_breaks(helper_code(missing, guarded, plain), self.source.text), after),
                    target=anchor,
                    serves=tuple(report for *_, report in self.applied),
                    # Not a site of the idiom: analyze's affinity report counts sites, not this.
                    data={"fused": "helpers"},
                )
            )

    def _helpers_rule(self, templates: list[str]) -> Rule:
        """The rule the report of added `templates` goes under: that of the rewrites they serve, or, where
        they only restore deleted helpers, the first helper's (`helper_rules`)."""
        return self.applied[0][2].rule if self.applied else helper_rules()[HELPER_NAMES[templates[0]]]

    def _import_helpers(self, tree: ast.Module, module: str, unbound: list[str]) -> None:
        """A file of a package imports the helpers its branches call from the package's helper module,
        which the driver writes once for all of them (`npu_migrate.output.helper_module`)."""
        by_name = {name: template for template, name in HELPER_NAMES.items()}
        called = dict.fromkeys([*(t for _, names, _ in self.applied for t in names), *map(by_name.get, unbound)])
        if not called:
            return
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
                self._helpers_rule([by_name[name] for name in missing]),
                tree,
                f"fused-op helpers {listed} imported from `{module}`, "
                + ("the helper module beside it" if is_sibling(module) else "the package's helper module"),
                fix=fix,
                target=target,
                serves=tuple(report for *_, report in self.applied),
                data={"fused": "helpers"},
            )
        )

    # -- helpers of another version ----------------------------------------------------------------------

    def _stale_helpers(self, tree: ast.Module) -> None:
        """Report each helper the file defines (a package's helper module, or a file with its own helpers)
        that differs from what this version writes, leaving it as it is: an older release's (a fix since
        then never reaches it, as helpers present are never rewritten) or the user's edit, which must stay.
        Layout, comments and docstrings do not count."""
        from npu_migrate import __version__

        for name, stmt in definitions(tree).items():
            rule = helper_rules().get(name)
            if (
                rule is None
                or rule.id not in self.enabled
                or (key := _definition_key(self.source.segment(stmt))) is None
                or key in helper_definitions()[name]
            ):
                continue
            group = helper_groups()[name]
            definition = (
                "its definition"
                if len(group) == 1
                else "the definitions of " + " and ".join(f"`{n}`" for n in group) + ", which are written together,"
            )
            self.reports.append(
                TreeReport(
                    rule,
                    stmt,
                    f"fused-op helper `{name}` differs from the one npu-migrate {__version__} writes (an older "
                    f"release's, or edited): left as it is. To take this version's, delete {definition} and run "
                    "`npu-migrate apply` again over the files that call it (with --force while the deletion is "
                    f"uncommitted); to keep it, add `# noqa: {rule.id}` to the line that defines it",
                    data={"fused": "helpers", "helper": name},
                )
            )


def templates_defining(names: Iterable[str]) -> list[str]:
    """The helper templates that define `names`, with the helpers and kernel functions they call and the
    prelude (every helper calls `_is_npu`), in a fixed order: prelude, kernel functions, the rest by name."""
    by_name = {name: template for template, name in HELPER_NAMES.items()}
    # and the helpers they call (`_npu_sdpa` calls `_npu_fusion_sdpa`, which calls `_npu_causal_mask`)
    wanted = with_called_helpers(sorted(by_name[name] for name in names if name in by_name))
    kernels = set(kernel_templates().values())
    return [
        PRELUDE,
        *sorted(t for t in wanted if t in kernels),
        *sorted(t for t in wanted if t not in kernels | {PRELUDE}),
    ]


def _reads_helpers(names: Iterable[str]) -> bool:
    """Whether a file whose identifiers are `names` may read a helper's name."""
    return any(name in names for name in HELPER_NAMES.values())


def _helpers_called(tree: ast.Module) -> set[str]:
    """The helpers (by `HELPER_NAMES`) the file's code outside the helpers' definitions reads, where nothing
    but those definitions binds them (a name the file imports from elsewhere, or binds in another way, is
    not ours to write). None where a `from ... import *` may bind them."""
    helpers = set(HELPER_NAMES.values())
    read, bound = set(), set()
    for stmt in tree.body:
        if defined_name(stmt) in helper_definitions():
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, (*_DEFS, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.alias):
                if node.name == "*":
                    return set()
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                bound.update(node.names)
    return (read & helpers) - bound


@functools.lru_cache(maxsize=512)
def _definition_key(code: str) -> str | None:
    """`definition_key` of the one statement `code` (a helper is the same in many files: read once), or None
    where its type comments do not parse."""
    try:
        return definition_key(parse_typed(code).body[0])
    except (SyntaxError, ValueError, IndexError):
        return None
