"""Fused-operator injection (NPU7xx): RMSNorm, SwiGLU, rotary embedding and SDPA get a torch_npu fast path.

The checker folds each function into the expression it returns (`symbolic.fold`) and asks the idiom
matchers, one module per op, whether that expression is theirs. A match becomes a branch in front of
the untouched original body:

    def forward(self, hidden_states):
        if _is_npu(hidden_states) and <the kernel's constraints>:
            return torch_npu.npu_rms_norm(hidden_states, self.weight, epsilon=self.variance_epsilon)[0]
        ...original code...

and the file gets, once, a prelude after its imports: a guarded `import torch_npu` and `_is_npu(x)`,
true only when torch_npu imported, an NPU is available and `x` is on it. Off an NPU nothing changes,
bit for bit. The branch calls the kernels through the module-level name `torch_npu`, so a test (or a
`verify` command) can substitute CPU reference implementations and force `_is_npu` true.

Module-level helpers the function calls (`rotate_half(q)`) are folded in too, so an idiom is known by
what it computes, not by a name. Attention is the exception to the branch scheme: an
`F.scaled_dot_product_attention` call sits among control flow and what decides the kernel's fit is
only known at run time, so the call itself is wrapped (`attention.py`).

A second run recognises the branches (`if _is_npu(` opening a body), the wrapped calls and the helpers
by name.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

import libcst as cst

from npu_migrate.imports import insertion_index
from npu_migrate.rule import Checker
from npu_migrate.templating import render
from npu_migrate.transforms.fused import attention, rms_norm, rotary, swiglu
from npu_migrate.transforms.fused.symbolic import Function, Outcome, has_fused_branch

MATCHERS = (rms_norm, swiglu, rotary, attention)
PRELUDE = "prelude.py.j2"
#: The module-level definition each helper template provides: present means already inserted.
HELPER_NAMES = {PRELUDE: "_is_npu", "is_silu.py.j2": "_is_silu", rotary.HELPER: "_npu_rotary_fits", attention.HELPER: attention.WRAPPER}


class _Class:
    def __init__(self, node: cst.ClassDef) -> None:
        self.node = node
        self.methods = {
            stmt.name.value: stmt for stmt in node.body.body if isinstance(stmt, cst.FunctionDef)
        } if isinstance(node.body, cst.IndentedBlock) else {}
        self._trees: dict[str, ast.FunctionDef] | None = None
        self._code: str | None = None

    def code(self, code) -> str:
        """The class's source, generated once: every method looks at it (quadratic otherwise)."""
        if self._code is None:
            self._code = code(self.node)
        return self._code

    def trees(self, code) -> dict[str, ast.FunctionDef]:
        if self._trees is None:
            self._trees = {name: _parse_function(code(node)) for name, node in self.methods.items()}
        return self._trees


def _parse_function(code: str) -> ast.FunctionDef:
    return ast.parse(code).body[0]


class _BoundNames(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)  # over-approximates: a name merely read there is dropped too


class _ModuleFunctions(Mapping):
    """The module-level defs a fused idiom may call (`rotate_half`), parsed on first use. A name the
    module defines twice or also binds otherwise is left out: which definition a call reaches is unknown."""

    def __init__(self, module: cst.Module, code) -> None:
        defs: dict[str, cst.FunctionDef] = {}
        rebound: set[str] = set()
        for stmt in module.body:
            if isinstance(stmt, cst.FunctionDef):
                if stmt.name.value in defs:
                    rebound.add(stmt.name.value)
                defs[stmt.name.value] = stmt
            elif isinstance(stmt, cst.ClassDef):
                rebound.add(stmt.name.value)
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else (
                        [small.target] if isinstance(small, (cst.AnnAssign, cst.AugAssign)) else []
                    )
                    rebound.update(t.value for t in targets if isinstance(t, cst.Name))
                    if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                        for alias in small.names:
                            bound = alias.asname.name if alias.asname else alias.name
                            if isinstance(bound, cst.Name):
                                rebound.add(bound.value)
            else:  # `if`/`try`/`with` at top level: whatever they bind
                collector = _BoundNames()
                stmt.visit(collector)
                rebound.update(collector.names)
        self._nodes = {name: node for name, node in defs.items() if name not in rebound}
        self._code = code
        self._trees: dict[str, ast.FunctionDef] = {}

    def __getitem__(self, name: str) -> ast.FunctionDef:
        if name not in self._trees:
            self._trees[name] = _parse_function(self._code(self._nodes[name]))
        return self._trees[name]

    def __iter__(self):
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)


def _defined_names(module: cst.Module) -> set[str]:
    return {stmt.name.value for stmt in module.body if isinstance(stmt, (cst.FunctionDef, cst.ClassDef))}


def _prelude_index(module: cst.Module) -> int:
    """After the last top-level import that precedes the first def or class."""
    index = insertion_index(module)
    for position, stmt in enumerate(module.body):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            break
        if isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
        ):
            index = position + 1
    return index


def _insert_helpers(module: cst.Module, templates: list[str]) -> cst.Module:
    existing = _defined_names(module)
    wanted = [t for t in templates if HELPER_NAMES[t] not in existing]
    text = "\n\n".join(render(t) for t in wanted)
    new = list(cst.parse_module(text).body)
    blank = cst.EmptyLine(indent=False, whitespace=cst.SimpleWhitespace(""))
    new[0] = new[0].with_changes(leading_lines=[blank, blank])
    body = list(module.body)
    index = _prelude_index(module)
    body[index:index] = new
    return module.with_changes(body=body)


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


class FusedOpsChecker(Checker):
    rules = tuple(m.RULE for m in MATCHERS)
    markers = tuple(dict.fromkeys(marker for m in MATCHERS for marker in m.MARKERS))

    @classmethod
    def wants(cls, index) -> bool:
        # Identifiers each idiom cannot be written without: "sin" and "sqrt" as substrings are in
        # "using" and "sqrt(d_model)" docstrings of half the files that mention them.
        return (
            index.uses("rsqrt") or index.uses("sqrt") and index.uses("mean")  # RMSNorm
            or index.uses("silu", "SiLU", "act_fn", "activation_fn", "ACT2FN", "act")  # SwiGLU
            or index.uses("cos") and index.uses("sin") or index.uses("view_as_complex", "polar")  # rotary
            or index.uses("scaled_dot_product_attention", "flash_attn_func", "softmax")  # attention
        )

    def __init__(self, ctx, enabled) -> None:
        super().__init__(ctx, enabled)
        self._classes: list[_Class | None] = []  # None: a function scope between class and method
        self._applied: list[Outcome] = []
        self._functions: _ModuleFunctions | None = None
        self._defs: list[cst.FunctionDef] = []  # the enclosing functions, innermost last

    # -- scopes ----------------------------------------------------------------------------------------

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(_Class(node))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._classes.pop()
        self._defs.pop()

    # -- matching --------------------------------------------------------------------------------------

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        owner = self._classes[-1] if self._classes else None
        self._classes.append(None)
        self._defs.append(node)
        # A method may spell the idiom through its siblings (`self._norm(x)`): look at the whole class.
        scope = owner.code(self.ctx.code) if owner is not None else self.ctx.code(node)
        matchers = [m for m in MATCHERS if m.RULE.id in self.enabled and any(k in scope for k in m.MARKERS)]
        if not matchers:
            return
        tree = _parse_function(self.ctx.code(node))
        if has_fused_branch(tree):
            return
        siblings = owner.trees(self.ctx.code) if owner is not None else {}
        if self._functions is None:
            self._functions = _ModuleFunctions(self.ctx.module, self.ctx.code)
        fn = Function(tree, owner is not None, self._qualname, siblings, self._functions, self.ctx.api)
        for matcher in matchers:
            outcome = matcher.match(fn)
            if outcome is not None:
                self._decide(node, outcome)
                return

    def _decide(self, node: cst.FunctionDef | cst.Call, outcome: Outcome, fix=None) -> None:
        torch = self.ctx.imports.bindings.get("torch")
        if outcome.template is not None and (torch is None or torch.qualname != "torch"):
            outcome.message += " not injected: the file does not `import torch` at module level, which the branch uses"
            outcome.template = None
        if outcome.template is not None and isinstance(node, cst.FunctionDef) and not isinstance(node.body, cst.IndentedBlock):
            outcome.message += " not injected: the function body is on the `def` line"
            outcome.template = None
        if outcome.template is None:
            self.report(outcome.rule, node, outcome.message)
            return
        self._applied.append(outcome)
        if fix is not None:  # a call rewritten in place; the template is a module-level helper
            self.report(outcome.rule, node, outcome.message, fix=fix)
            return
        branch = cst.parse_statement(render(outcome.template, **outcome.context))
        self.report(outcome.rule, node, outcome.message, fix=lambda updated: _insert_branch(updated, branch))

    def visit_Call(self, node: cst.Call) -> None:
        if attention.RULE.id not in self.enabled:
            return
        name = self.ctx.qualname(node.func)
        if name is None or not name.startswith(("torch.nn.functional.", "flash_attn.")):
            return
        outcome = attention.match_call(name, self.ctx.api)
        if outcome is None:
            return
        torch = self.ctx.imports.bindings.get("torch")
        if outcome.template is not None and (torch is None or torch.qualname != "torch"):
            outcome.message = (
                "scaled_dot_product_attention not fused: the file does not `import torch` at module level, "
                "which the wrapper uses"
            )
            outcome.template = None
        if outcome.template is not None:
            scripted = any(
                self.ctx.qualname(d.decorator) in ("torch.jit.script", "torch.jit.script_method")
                for d in (dec for f in self._defs for dec in f.decorators)
            )
            if scripted:
                outcome.message = "scaled_dot_product_attention not fused: it is called from TorchScript, which cannot call the wrapper"
                outcome.template = None
        self._decide(node, outcome, fix=attention.wrap)

    def _qualname(self, node: ast.expr) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        binding = self.ctx.imports.bindings.get(node.id)
        return None if binding is None else ".".join([binding.qualname, *reversed(parts)])

    # -- the prelude -----------------------------------------------------------------------------------

    def finish(self) -> None:
        if not self._applied:
            return
        templates = [PRELUDE, *dict.fromkeys(h for o in self._applied for h in o.helpers)]
        existing = _defined_names(self.ctx.module)
        missing = [t for t in templates if HELPER_NAMES[t] not in existing]
        if missing:
            names = ", ".join(f"`{HELPER_NAMES[t]}`" for t in missing)
            self.report(
                self._applied[0].rule, self.ctx.module,
                f"fused-op helpers {names} (and a guarded `import torch_npu`) added after the imports",
                fix=lambda updated: _insert_helpers(updated, missing),
            )
