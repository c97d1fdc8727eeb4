"""What a function computes, as one expression: the ground the fused-op idioms are matched on.

A function whose body is straight-line code (assignments to names, then one `return`) is folded into
its return expression with every local replaced by the expression it holds, so the idiom is found
however the code is split into statements or named. Calls of sibling methods (`self._norm(x)`) with
straight-line bodies are folded in too. Substituted expressions are shared, not copied: a call that
occurs twice *by identity* in a folded expression is one evaluation in the original code, which tells
the emitters when re-stating an expression would evaluate something twice.

Matching works on Python's `ast` (no whitespace or parentheses to see through); the libcst tree is only
used to insert the generated branch, so the original code stays byte-identical.
"""

from __future__ import annotations

import ast
import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npu_migrate.engine.rule import Rule


@dataclass
class Outcome:
    """What a matcher decided for one function: a branch to inject (`template` set) or a declined finding."""

    rule: Rule
    message: str
    template: str | None = None
    context: dict[str, object] = field(default_factory=dict)
    helpers: tuple[str, ...] = ()  # module-level helper templates the branch calls, besides the prelude
    #: The top-level body statement the branch goes in front of, when not the first: the statements before
    #: it (which the branch reads, as `repeat_kv` before hand-written attention) run on both paths.
    before: ast.stmt | None = None
    #: A declined finding whose reason is the file's, not the site's: reported at its first site only.
    per_file: bool = False
    #: The finding's data (`Report.data`): {"fused": "native"} for a site torch_npu already fuses (SDPA).
    data: dict[str, str] = field(default_factory=dict)
    #: For a declined outcome, what would let it apply, joined to the message by the checker so that every
    #: decline tells the user what to do: "to fuse it, <a change in their code>", or "nothing in the code
    #: can: <why>" where no edit of theirs would (LayerNorm is not RMSNorm; the torch_npu lacks the kernel).
    remedy: str = ""
    #: Branches in place of statements of the body rather than one in front of it (a function with control
    #: flow whose idiom is a statement or two): each run of consecutive statements of one block with its
    #: `template` context. The template writes `pass` where the original statements stay, as the fallback.
    in_place: list[tuple[list[ast.stmt], dict[str, object]]] = field(default_factory=list)


#: The compound statements whose blocks `Outcome.in_place` reaches, and those blocks (a `try`'s handlers
#: are not among them).
IN_PLACE_BLOCKS: dict[type, tuple[str, ...]] = {
    ast.If: ("body", "orelse"),
    ast.For: ("body", "orelse"),
    ast.AsyncFor: ("body", "orelse"),
    ast.While: ("body", "orelse"),
    ast.With: ("body",),
    ast.AsyncWith: ("body",),
    ast.Try: ("body", "orelse", "finalbody"),
}


def statement_blocks(statements: list[ast.stmt]):
    """Each block of statements that `Outcome.in_place` reaches: this one and those nested in its compound
    statements (not in nested defs or classes, functions of their own, nor under a branch this codemod
    wrote: a second run)."""
    yield statements
    for stmt in statements:
        if isinstance(stmt, ast.If) and "_is_npu(" in ast.unparse(stmt.test):
            continue
        for name in IN_PLACE_BLOCKS.get(type(stmt), ()):
            yield from statement_blocks(getattr(stmt, name))


#: Where a name in an expression is the expression's own: no code in front of it can read it.
OWN_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def evaluated_nodes(node: ast.AST):
    """The nodes of `node` evaluated whenever it is: not in lambdas and comprehensions (their names are their
    own), nor in the sides of an `... if ... else ...` or past the first operand of `and` / `or`; what a
    branch in front of a statement may test or compute again."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, OWN_SCOPES):
            continue
        yield current
        if isinstance(current, ast.IfExp):
            stack.append(current.test)
        elif isinstance(current, ast.BoolOp):
            stack.append(current.values[0])
        else:
            stack.extend(ast.iter_child_nodes(current))


def nodes_of(tree: ast.AST) -> list[ast.AST]:
    """Every node under `tree`, in `ast.walk`'s order, at half its cost (no nested generators)."""
    found = [tree]
    for node in found:  # the list grows while it is read: breadth first, as `ast.walk`
        for name in node._fields:
            value = getattr(node, name, None)
            if type(value) is list:
                found.extend([item for item in value if isinstance(item, ast.AST)])
            elif isinstance(value, ast.AST):
                found.append(value)
    return found


class NotStraightLine(Exception):
    """The body has control flow or side effects: it has no single expression to match."""


#: The remedy (`Outcome.remedy`) of a decline for `NotStraightLine`.
STRAIGHT_LINE = "to fuse it, move that statement out of the function (the caller may do it)"


@dataclass
class Function:
    """A function under analysis, with what the matchers may ask about its surroundings."""

    tree: ast.FunctionDef
    is_method: bool
    qualname: Callable[[ast.expr], str | None]  # `F.silu` -> "torch.nn.functional.silu"
    siblings: dict[str, ast.FunctionDef] = field(default_factory=dict)  # other methods of the class
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)  # module-level defs, by name
    api: object | None = None  # the NpuApi of the chosen torch_npu version

    #: The tensors whose CUDA-only fast paths `fold` skipped at the top of the body.
    fast_path_tensors: list[str] = field(default_factory=list)

    #: The `with torch.autocast(..., enabled=False):` that is the whole body, when `fold(autocast_off=True)`
    #: read through it: a branch must go inside it (first in its body), where the original's ops run.
    autocast_off: ast.With | None = None

    #: Every identifier of the file (`AstIndex.names`), when known: a matcher may skip looking for a call
    #: whose name is not among them.
    names: frozenset[str] | set[str] | None = None

    #: The helpers the file imports from sibling modules (`imported.Scope`), for an idiom that follows them
    #: (NPU703: `imported.following`); None when the file imports none or its place is not known.
    imported: object | None = None

    #: The name of the class the function is defined in, if any: `ClassName.helper(x)` calls a staticmethod
    #: sibling, which `inline_functions` inlines as a module function.
    class_name: str | None = None

    #: The class the function is defined in, and the file's tree, when known: `sole_binding` reads every
    #: binding of an attribute in the class and in the file's subclasses of it.
    owner: ast.ClassDef | None = None
    module: ast.Module | None = None

    def around(self, tree: ast.FunctionDef) -> Function:
        """The function's surroundings (resolver, siblings, file, class, imports) around another tree: a
        straight tail of the body, one way through its `if`s, a `with` block's body. What was read of the
        old body (its CUDA fast paths, an autocast-off block, its nodes) is not carried over."""
        return replace(self, tree=tree, fast_path_tensors=[], autocast_off=None)

    @functools.cached_property
    def nodes(self) -> list[ast.AST]:
        """Every node of the function, walked once: each matcher looks through them."""
        return nodes_of(self.tree)

    def may_call(self, qualnames: tuple[str, ...]) -> bool:
        """False when no call in the file can resolve to one of `qualnames`: the last part of a resolved
        name is an attribute or an imported name, so one of the file's identifiers."""
        return self.names is None or any(q.rsplit(".", 1)[-1] in self.names for q in qualnames)

    @functools.cached_property
    def stores(self) -> list[list[str]]:
        """Per body statement (after the docstring), the names it binds: `straight_tail` asks for every
        prefix of the body, so they are walked once, not once per prefix."""
        return [
            [node.id for node in ast.walk(stmt) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)]
            for stmt in body_statements(self.tree)
        ]

    @functools.cached_property
    def calls(self) -> list[ast.Call]:
        return [node for node in self.nodes if isinstance(node, ast.Call)]

    @property
    def params(self) -> list[str]:
        args = self.tree.args
        names = [a.arg for a in (*args.posonlyargs, *args.args)]
        return names[1:] if self.is_method else names

    @property
    def self_name(self) -> str | None:
        args = [*self.tree.args.posonlyargs, *self.tree.args.args]
        return args[0].arg if self.is_method and args else None

    def attribute_source(self, attr: str) -> ast.expr | None:
        """The value `__init__` assigns to `self.<attr>`, when it does so exactly once."""
        init = self.siblings.get("__init__")
        if init is None:
            return None
        found = [
            node.value
            for node in ast.walk(init)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Attribute) and target.attr == attr
        ]
        return found[0] if len(found) == 1 else None

    def sole_binding(self, attr: str) -> tuple[ast.expr | None, str]:
        """The value `self.<attr>` holds wherever a method of the class runs, with "", when the file proves
        it: the class binds it once, unconditionally, at the top level of `__init__`, and no class of the
        file that subclasses it binds it again (a subclass in another file is not seen, as for a sibling
        method it might override). Otherwise None and why not (for a declined finding): a
        method, a branch of `__init__` or a subclass that rebinds it (`self.attend = nn.Sigmoid()`) makes
        the module called something else."""
        init = self.siblings.get("__init__")
        if init is None or self.owner is None:
            return None, f"`self.{attr}` is not bound in this class's `__init__`"
        bindings = _bindings(self.owner, attr)
        if len(bindings) != 1:
            where = ", ".join(f"line {n.lineno}" for n in bindings)
            return None, f"`self.{attr}` is bound {len(bindings)} times in the class ({where})"
        args = [*init.args.posonlyargs, *init.args.args]
        body = body_statements(init)
        stmt = next((s for s in body if any(n is bindings[0] for n in ast.walk(s))), None)
        targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else getattr(stmt, "targets", [])
        if (
            not args
            or not isinstance(stmt, (ast.Assign, ast.AnnAssign))
            or stmt.value is None
            or len(targets) != 1
            or not _is_self_attribute(targets[0], args[0].arg, attr)
            # after an early `return` it may not be bound at all
            or any(isinstance(n, ast.Return) for s in body[: body.index(stmt)] for n in ast.walk(s))
        ):
            line = bindings[0].lineno
            return None, f"`self.{attr}` is bound under control flow or outside `__init__`'s body (line {line})"
        for sub in _subclasses(self.module, self.owner):
            again = _bindings(sub, attr)
            if again:
                return None, f"the subclass `{sub.name}` binds `self.{attr}` again (line {again[0].lineno})"
        return stmt.value, ""


#: Calls that bind an attribute by name: `setattr(self, "attend", m)`, `self.add_module("attend", m)`.
_BINDING_CALLS = frozenset(("setattr", "delattr", "__setattr__", "__delattr__", "add_module", "register_module"))


def _is_self_attribute(node: ast.expr, self_name: str, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == self_name
    )


def _bindings(cls: ast.ClassDef, attr: str) -> list[ast.AST]:
    """Every node of `cls` that may bind or delete an attribute `attr`, on any object: an assignment, an
    annotated or augmented one, a `for` / `with` target, `del`, and a call that binds by name with that name
    or a name it computes."""
    found: list[ast.AST] = []
    for node in nodes_of(cls):
        if isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.append(node)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in _BINDING_CALLS:
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if not names or attr in names:
                    found.append(node)
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _subclasses(module: ast.Module | None, cls: ast.ClassDef) -> list[ast.ClassDef]:
    """The classes of the file that derive from `cls`, directly or through one another (by the base's last
    name: `class B(mixer.A)` counts too)."""
    if module is None:
        return []
    classes = [n for n in nodes_of(module) if isinstance(n, ast.ClassDef) and n is not cls]
    names, found = {cls.name}, []
    grew = True
    while grew:
        grew = False
        for other in classes:
            if other in found:
                continue
            bases = {
                b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
                for b in other.bases
            }
            if bases & names:
                found.append(other)
                names.add(other.name)
                grew = True
    return found


def body_statements(tree: ast.FunctionDef) -> list[ast.stmt]:
    """The statements after the docstring."""
    body = tree.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[1:]
    return body


def has_fused_branch(tree: ast.FunctionDef) -> bool:
    """True when the body already holds a branch this codemod injected (a second run): first, or in front
    of a straight-line tail."""
    body = body_statements(tree)
    if len(body) == 1 and isinstance(body[0], ast.With):
        body = body[0].body  # a branch first inside the autocast-disabled block that is the body (`fold`)
    for stmt in body:
        if not isinstance(stmt, ast.If):
            continue
        test = stmt.test
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            test = test.values[0]
        if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "_is_npu":
            return True
    return False


def straight_tail(fn: Function, start: int, keep: bool = False) -> Function:
    """`fn` as if its body began at statement `start` (after the docstring), with every name the skipped
    statements bind taken as a parameter: what the statements from `start` on compute from the values
    those names hold there. A branch put in front of them sees the same values. With `keep`, the skipped
    assignments whose names still hold what they assigned (`_still_valid`) are kept in front of the tail."""
    body = body_statements(fn.tree)
    kept = _still_valid(body[:start]) if keep else []
    kept_ids = {id(k) for k in kept}
    bound = [name for stmt, names in zip(body[:start], fn.stores) if id(stmt) not in kept_ids for name in names]
    args = copy.copy(fn.tree.args)
    known = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    args.args = [*args.args, *(ast.arg(name) for name in dict.fromkeys(bound) if name not in known)]
    tree = copy.copy(fn.tree)
    tree.args, tree.body = args, [*kept, *body[start:]]
    return fn.around(tree)


def _still_valid(statements: list[ast.stmt]) -> list[ast.stmt]:
    """The assignments of `statements` to names whose value at their end is what they assigned: no later
    statement rebinds the name or a name the value reads (litgpt's `rotated = cat((-x2, x1))` before an
    `if` that reshapes the tables). The straight tail after them may read them as they were computed."""
    stores = [_bound_names(stmt) for stmt in statements]
    after: list[frozenset[str]] = [frozenset() for _ in statements]  # the names the statements after each bind
    for at in range(len(statements) - 2, -1, -1):
        after[at] = after[at + 1] | stores[at + 1]
    kept = []
    for at, stmt in enumerate(statements):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            continue
        targets = stmt.targets[0]
        # what `fold` reads: a name, or names from a tuple of as many values, or a shape's sizes
        pairs = isinstance(targets, ast.Tuple) and (isinstance(stmt.value, ast.Tuple) or _shape_of(stmt.value))
        names = [targets] if isinstance(targets, ast.Name) else targets.elts if pairs else None
        if not names or not all(isinstance(n, ast.Name) for n in names):
            continue
        read, mutates = _value_facts(stmt.value)
        # `q = f(q)` reads what it rebinds: run again, it would read its own result
        if not (read | {n.id for n in names}) & after[at] and not read & {n.id for n in names} and not mutates:
            kept.append(stmt)
    return kept


def forget_statements() -> None:
    """Drop what `_value_facts` / `_bound_names` cached: their keys are `ast` nodes, which keep the trees of
    the files they came from alive; a new file asks about other nodes (memory bounded per file, #26)."""
    _value_facts.cache_clear()
    _bound_names.cache_clear()


@functools.lru_cache(maxsize=4096)
def _value_facts(value: ast.expr) -> tuple[frozenset[str], bool]:
    """(the names `value` reads, whether it calls an in-place method), cached as `_bound_names`."""
    nodes = nodes_of(value)
    return frozenset(n.id for n in nodes if isinstance(n, ast.Name)), any(_mutates(n) for n in nodes)


@functools.lru_cache(maxsize=4096)
def _bound_names(stmt: ast.stmt) -> frozenset[str]:
    """The names `stmt` binds or deletes (cached: every straight tail of a function asks again)."""
    return frozenset(
        n.id for n in nodes_of(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))
    )


def _mutates(node: ast.AST) -> bool:
    """An in-place method (`x.add_(...)`): its statement cannot be run again."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_")


def substitute(node: ast.AST, env: dict[str, ast.expr]) -> ast.AST:
    """`node` with every loaded name in `env` replaced by its (shared) value; `node` is not modified."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in env:
        return env[node.id]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        # liger's `shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(t.shape)]`: substituted
        # where no name it binds is one of the function's (which it would shadow inside) and no value put in
        # reads one (which it would capture).
        bound = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        values = [env[name] for name in loaded - bound if name in env]
        if bound & set(env) or any(isinstance(n, ast.Name) and n.id in bound for v in values for n in ast.walk(v)):
            raise NotStraightLine("it binds names in a nested scope")
        inner = {name: value for name, value in env.items() if name not in bound}
        return substitute_children(node, lambda child: substitute(child, inner))
    if isinstance(node, ast.Lambda):
        raise NotStraightLine("it binds names in a nested scope")
    return substitute_children(node, lambda child: substitute(child, env))


def _shape_of(value: ast.expr) -> bool:
    """`x.shape` or `x.size()` of a name: a tuple of sizes, `b, h, s, d = x.shape` its items (NeMo's
    `batch_size, num_heads, seq_len, head_dim = x.shape` before slicing by `head_dim // 2`)."""
    if isinstance(value, ast.Attribute) and value.attr == "shape":
        return isinstance(value.value, ast.Name)
    call = method_call(value, "size")
    return call is not None and not call.args and not call.keywords and isinstance(call.func.value, ast.Name)


def _starred_shape_unpack(target: ast.expr, value: ast.expr, fn: Function) -> list[ast.expr] | None:
    """The index of each name of `*lead, d, r = x.shape` (k-diffusion's interleaved `rotate_half`) in the
    shape: from the front before the star, from the end after it, the slice between for the star; None
    unless `value` is a shape (`_shape_of`), the names are plain with one starred, and the starred name is
    only ever read unpacked again (`x.view(*lead, d * r)`): a slice of a shape is a tuple where Python
    binds a list, alike only when unpacked."""
    if not (isinstance(target, ast.Tuple) and _shape_of(value)):
        return None
    stars = [at for at, e in enumerate(target.elts) if isinstance(e, ast.Starred)]
    if len(stars) != 1 or not all(
        isinstance(e.value if isinstance(e, ast.Starred) else e, ast.Name) for e in target.elts
    ):
        return None
    (star,) = stars
    name = target.elts[star].value.id
    unpacked = {id(n.value) for n in ast.walk(fn.tree) if isinstance(n, ast.Starred)}
    if any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and id(n) not in unpacked
        for n in ast.walk(fn.tree)
    ):
        return None
    after = len(target.elts) - star - 1
    indexes: list[ast.expr] = [ast.Constant(at) for at in range(star)]
    indexes.append(
        ast.Slice(
            lower=ast.Constant(star) if star else None,
            upper=ast.UnaryOp(ast.USub(), ast.Constant(after)) if after else None,
        )
    )
    indexes += [ast.UnaryOp(ast.USub(), ast.Constant(after - at)) for at in range(after)]
    return indexes


def _chunk_call(value: ast.expr, qualname) -> bool:
    """`x.chunk(2, ...)` or `torch.chunk(x, 2, ...)`: two halves, as tuple-unpacking needs."""
    if not isinstance(value, ast.Call):
        return False
    if isinstance(value.func, ast.Attribute) and value.func.attr == "chunk" and qualname(value.func) != "torch.chunk":
        first = value.args[0] if value.args else next((k.value for k in value.keywords if k.arg == "chunks"), None)
    elif qualname(value.func) == "torch.chunk":
        first = (
            value.args[1] if len(value.args) > 1 else next((k.value for k in value.keywords if k.arg == "chunks"), None)
        )
    else:
        return False
    return isinstance(first, ast.Constant) and first.value == 2


#: The autocast context managers (`torch.cuda.amp.autocast` is deprecated, still common).
_AUTOCASTS = (
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
    "torch.npu.amp.autocast",
    "torch_npu.npu.amp.autocast",
)


def disabled_autocast(stmt: ast.stmt, qualname) -> bool:
    """`with torch.autocast(..., enabled=False):` (or `torch.cuda.amp.autocast(enabled=False)`), every item
    an autocast context whose `enabled` is the constant False, none bound by `as`: the block's ops run in
    the dtypes the code gives them. Anything else in a `with` is not read through."""
    if not isinstance(stmt, ast.With) or not stmt.items:
        return False
    for item in stmt.items:
        call = item.context_expr
        if item.optional_vars is not None or not isinstance(call, ast.Call) or qualname(call.func) not in _AUTOCASTS:
            return False
        enabled = [k.value for k in call.keywords if k.arg == "enabled"]
        if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
            return False  # `**kwargs` / `*args` may say otherwise
        if len(enabled) != 1 or not (isinstance(enabled[0], ast.Constant) and enabled[0].value is False):
            return False
    return True


def cuda_only_tensor(test: ast.expr, fn: Function) -> str | None:
    """The parameter `p` when `test` can only hold for a CUDA tensor `p`: `p.is_cuda`, `p.device.type ==
    "cuda"`, alone or in an `and` of side-effect-free conditions (`fast_kernel is not None and p.is_cuda`)."""
    conditions = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    tested = None
    for condition in conditions:
        if (
            isinstance(condition, ast.Attribute)
            and condition.attr == "is_cuda"
            and isinstance(condition.value, ast.Name)
            and condition.value.id in fn.params
        ):
            tested = condition.value.id
        elif (
            isinstance(condition, ast.Compare)
            and len(condition.ops) == 1
            and isinstance(condition.ops[0], ast.Eq)
            and isinstance(condition.comparators[0], ast.Constant)
            and condition.comparators[0].value == "cuda"
            and isinstance(condition.left, ast.Attribute)
            and condition.left.attr == "type"
            and isinstance(condition.left.value, ast.Attribute)
            and condition.left.value.attr == "device"
            and isinstance(condition.left.value.value, ast.Name)
            and condition.left.value.value.id in fn.params
        ):
            tested = condition.left.value.value.id
        elif not (
            is_pure(condition)
            or isinstance(condition, ast.Compare)
            and all(is_pure(c) for c in (condition.left, *condition.comparators))
        ):
            return None
    return tested


def fold(
    fn: Function, depth: int = 0, inlined: bool = False, unpack: bool = False, autocast_off: bool = False
) -> ast.expr:
    """The return expression of `fn` with its locals (and inlinable sibling calls) substituted. CUDA-only
    fast paths (`if fast_kernel is not None and x.is_cuda: return fast_kernel(x)`, an `else` or not) are
    skipped: their tests are false on an NPU, so a fused branch put first keeps them for CUDA. A matcher
    must check that they test the tensor its branch tests (`Function.fast_path_tensors`). An `inlined` function's are not: its parameters stand
    for its caller's expressions, which the caller's branch does not test. With `unpack`, for a caller that
    inlines helpers (`inline_functions`, which must then see every one), `a, b = helper(...)` is read too.
    With `autocast_off`, a body that is one `with torch.autocast(..., enabled=False):` is read as the block's
    body (`Function.autocast_off`), for a matcher that puts its branch inside the block (Z-image's rotary)."""
    env: dict[str, ast.expr] = {}
    #: `out = torch.empty_like(t)` whose elements are being written (`unpack`): name -> (t, parity -> value).
    filling: dict[str, tuple[ast.expr, dict[int, ast.expr]]] = {}
    body = list(body_statements(fn.tree))
    fn.fast_path_tensors = []
    fn.autocast_off = None
    if autocast_off and not inlined and len(body) == 1 and disabled_autocast(body[0], fn.qualname):
        # Autocast disabled only means the ops run in the dtypes the code gives them, which the evaluator
        # assumes anyway; a branch first in the block runs the kernel under the same (disabled) autocast.
        fn.autocast_off = body[0]
        body = list(body[0].body)
    while body:
        stmt = body.pop(0)
        if isinstance(stmt, ast.Pass):
            continue
        if unpack and _fill(stmt, env, filling, fn.qualname):
            continue
        tested = None if inlined or not isinstance(stmt, ast.If) else cuda_only_tensor(stmt.test, fn)
        if tested is not None and tested not in env and isinstance(stmt.body[-1], ast.Return):
            # A CUDA-only fast path: false on an NPU, so what runs there is its `else` and what follows.
            fn.fast_path_tensors.append(tested)
            body[:0] = stmt.orelse
            continue
        if isinstance(stmt, ast.FunctionDef) and not stmt.decorator_list:
            # A helper defined in the body (`def rotate_half(t): ...`) is inlined like a module-level one,
            # when it reads nothing of the enclosing function (its closure would be the caller's values).
            _nested_function(fn, stmt)
            continue
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            if body:
                raise NotStraightLine("it returns before its last statement")
            return _inline_siblings(fn, substitute(stmt.value, env), depth)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            env[stmt.target.id] = substitute(stmt.value, env)
            continue
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            value = substitute(stmt.value, env)
            if isinstance(target, ast.Name):
                env[target.id] = value
                continue
            if (
                isinstance(target, ast.Tuple)
                and isinstance(value, ast.Tuple)
                and len(target.elts) == len(value.elts)
                and all(isinstance(e, ast.Name) for e in target.elts)
                and not any(isinstance(e, ast.Starred) for e in value.elts)
            ):
                # `a, b = x[:d], x[d:]`: every value is computed before any name is bound, as here.
                for element, part in zip(target.elts, value.elts):
                    env[element.id] = part
                continue
            starred = _starred_shape_unpack(target, stmt.value, fn)
            if starred is not None:
                # `*shape, d, r = x.shape`: the names before the star by index from the front, those after
                # from the end, the star the slice between (a list in Python, a torch.Size here: read only
                # where every use is `*shape`, which unpacks either alike).
                for element, index in zip(target.elts, starred):
                    name = element.value.id if isinstance(element, ast.Starred) else element.id
                    env[name] = ast.Subscript(value=value, slice=index, ctx=ast.Load())
                continue
            names = isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts)
            if names and (
                len(target.elts) == 2
                and _chunk_call(value, fn.qualname)
                or isinstance(stmt.value, ast.Name)
                or method_call(value, "unbind") is not None
                or _shape_of(stmt.value)
            ):
                # `a, b = t.chunk(2)`, `a, b = t.unbind(-2)` or `cos, sin = freqs` (a list of tables): the
                # parts by index, sharing the unpacked value, which the original evaluates once.
                for index, element in enumerate(target.elts):
                    env[element.id] = ast.Subscript(value=value, slice=ast.Constant(index), ctx=ast.Load())
                continue
            if (
                names
                and unpack
                and isinstance(value, ast.Call)
                and (isinstance(value.func, ast.Name) or module_function(fn, value.func) is not None)
            ):
                # `q, k = apply_rotary(q, k, cos, sin)`: the items of what the helper returns, which
                # `inline_functions` takes from the tuple its body builds, or declines (`UNPACKED`).
                for index, element in enumerate(target.elts):
                    item = ast.Subscript(value=value, slice=ast.Constant(index), ctx=ast.Load())
                    item.npu_unpacked = len(target.elts)  # type: ignore[attr-defined]
                    env[element.id] = item
                continue
        first_line = ast.unparse(stmt).splitlines()[0]
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.ListComp, ast.GeneratorExp)):
            # its items are not known one by one (llama-models' `a, b = [F.linear(x, w) for w in ...]`)
            raise NotStraightLine(f"it unpacks a comprehension into names (`{first_line}`)")
        raise NotStraightLine(f"the body is not straight-line assignments (`{first_line}`)")
    raise NotStraightLine("it has no return value")


def _fill(
    stmt: ast.stmt, env: dict[str, ast.expr], filling: dict[str, tuple[ast.expr, dict[int, ast.expr]]], qualname
) -> bool:
    """Wan's interleaved rotation written element-wise into a new tensor: `out = torch.empty_like(x)`, then
    `out[..., 0::2] = a` and `out[..., 1::2] = b`, every element written once, is `stack((a, b), -1)
    .flatten(-2)` in `x`'s dtype (what the assignments cast to): `out` is bound to that once both are
    written. True when `stmt` was such a statement; a statement that reads `out` before raises."""
    if filling and any(
        isinstance(n, ast.Name) and n.id in filling and isinstance(n.ctx, ast.Load)
        for n in ast.walk(stmt.value if isinstance(stmt, ast.Assign) else stmt)
    ):
        raise NotStraightLine("it reads a tensor before all its elements are written")
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        return False
    target, value = stmt.targets[0], stmt.value
    if (
        isinstance(target, ast.Name)
        and isinstance(value, ast.Call)
        and qualname(value.func) in ("torch.empty_like", "torch.zeros_like")
        and len(value.args) == 1
        and not value.keywords
    ):
        filling[target.id] = (substitute(value.args[0], env), {})
        env.pop(target.id, None)
        return True
    if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in filling):
        if isinstance(target, ast.Name):
            filling.pop(target.id, None)  # rebound unread: what was written to it is never read
        return False
    index = target.slice
    parity = None
    if (
        isinstance(index, ast.Tuple)
        and len(index.elts) == 2
        and isinstance(index.elts[0], ast.Constant)
        and index.elts[0].value is Ellipsis
        and isinstance(index.elts[1], ast.Slice)
    ):
        part = index.elts[1]
        lower = 0 if part.lower is None else getattr(part.lower, "value", None)
        if part.upper is None and isinstance(part.step, ast.Constant) and part.step.value == 2 and lower in (0, 1):
            parity = lower
    like, written = filling[target.value.id]
    if parity is None or parity in written:
        raise NotStraightLine(f"it writes `{ast.unparse(target)}`, not one parity of the last dim once")
    written[parity] = substitute(value, env)
    if len(written) == 2:
        load = ast.Load()
        stacked = ast.Call(
            ast.Attribute(ast.Name("torch", load), "stack", load),
            [ast.Tuple([written[0], written[1]], load)],
            [ast.keyword("dim", ast.Constant(-1))],
        )
        flat = ast.Call(ast.Attribute(stacked, "flatten", load), [ast.Constant(-2)], [])
        env[target.value.id] = ast.Call(ast.Attribute(flat, "type_as", load), [like], [])
        del filling[target.value.id]
    return True


def _nested_function(fn: Function, node: ast.FunctionDef) -> None:
    args = node.args
    own = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    own |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    outer = set(fn.params) | {
        n.id for n in ast.walk(fn.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    free = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - own
    if free & outer:
        raise NotStraightLine(f"the nested function `{node.name}` reads the enclosing function's names")
    extended = getattr(fn.functions, "with_function", None)  # `imported.Namespace`: nothing read to list it
    fn.functions = extended(node.name, node) if extended is not None else {**fn.functions, node.name: node}


def _inline_siblings(fn: Function, expr: ast.expr, depth: int) -> ast.expr:
    """Replace `self.m(args)` by the folded body of sibling method `m` where that is possible."""
    self_name = fn.self_name
    if self_name is None or depth > 3:
        return expr

    memo: dict[int, ast.AST] = {}  # a shared subtree stays shared after inlining

    def visit(node: ast.AST) -> ast.AST:
        if id(node) not in memo:
            memo[id(node)] = rewrite(node)
        return memo[id(node)]

    def rewrite(node: ast.AST) -> ast.AST:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == self_name
            and node.func.attr in fn.siblings
            and not node.keywords
        ):
            sibling = Function(fn.siblings[node.func.attr], True, fn.qualname, fn.siblings, fn.functions, fn.api)
            if len(sibling.params) == len(node.args) and sibling.self_name is not None:
                try:
                    body = fold(sibling, depth + 1, inlined=True)
                except NotStraightLine:
                    return node
                env = dict(zip(sibling.params, (visit(a) for a in node.args)))
                env[sibling.self_name] = node.func.value
                return substitute(body, env)
        return substitute_children(node, visit)

    return visit(expr)


def substitute_children(node: ast.AST, visit: Callable[[ast.AST], ast.AST]) -> ast.AST:
    changes = {}
    for name, value in ast.iter_fields(node):
        if isinstance(value, list):
            new = [visit(v) if isinstance(v, ast.AST) else v for v in value]
            if any(a is not b for a, b in zip(new, value)):
                changes[name] = new
        elif isinstance(value, ast.AST):
            new = visit(value)
            if new is not value:
                changes[name] = new
    if not changes:
        return node
    clone = copy.copy(node)
    for name, value in changes.items():
        setattr(clone, name, value)
    return clone


def same(a: ast.AST | None, b: ast.AST | None) -> bool:
    return a is not None and b is not None and (a is b or ast.dump(a) == ast.dump(b))


def evaluates_twice(expr: ast.expr) -> bool:
    """True when some call of the original code occurs twice in `expr` (so it would run twice)."""
    seen: set[int] = set()
    for node in walk_shared(expr):
        if isinstance(node, ast.Call):
            if id(node) in seen:
                return True
            seen.add(id(node))
    return False


def walk_shared(node: ast.AST):
    """Like `ast.walk`, but visits a shared subtree once per occurrence."""
    yield node
    for child in ast.iter_child_nodes(node):
        yield from walk_shared(child)


def method_call(node: ast.expr, name: str) -> ast.Call | None:
    """`node` if it is `<something>.name(...)`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
        return node
    return None


def argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def is_pure(node: ast.expr) -> bool:
    """Names, attributes, constants and arithmetic on them: safe to evaluate again in a guard."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return is_pure(node.value)
    if isinstance(node, ast.UnaryOp):
        return is_pure(node.operand)
    if isinstance(node, ast.BinOp):
        return is_pure(node.left) and is_pure(node.right)
    return False


def source(node: ast.expr) -> str:
    return ast.unparse(node)


#: A quoted expression in a finding longer than this shows its start and end: the line number says where
#: the rest is, and a 300-character expression repeated over a report hides the reason around it.
QUOTE_LIMIT = 72


def brief(message: str) -> str:
    """`message` with each backquoted span longer than QUOTE_LIMIT cut to its start and end."""
    parts = message.split("`")
    for at in range(1, len(parts) - 1, 2):  # the odd parts are inside backquotes (an unpaired last one is not)
        if len(parts[at]) > QUOTE_LIMIT:
            parts[at] = f"{parts[at][: QUOTE_LIMIT - 22]} ... {parts[at][-16:]}"
    return "`".join(parts)


def inline_functions(fn: Function, expr: ast.expr, depth: int = 0) -> ast.expr:
    """Replace calls of module-level functions (`rotate_half(q)`) by their folded bodies where possible,
    so an idiom is recognised by what a helper computes, whatever the helper is called."""
    # Staticmethods of the function's class, called through the class or the instance (`Rope._rotate_half(x)`).
    static = {
        name: tree
        for name, tree in fn.siblings.items()
        if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in tree.decorator_list)
    }
    if not (fn.functions or static) or depth > 3:
        return expr
    shadowed = set(fn.params) | {a.arg for a in (*fn.tree.args.kwonlyargs,)} | {fn.tree.name}
    owners = {fn.class_name, fn.self_name} - {None} - shadowed
    memo: dict[int, ast.AST] = {}

    def visit(node: ast.AST) -> ast.AST:
        if id(node) not in memo:
            memo[id(node)] = rewrite(node)
        return memo[id(node)]

    def rewrite(node: ast.AST) -> ast.AST:
        callee = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id not in shadowed
            and node.func.id in fn.functions
        ):
            # An imported helper's own calls reach the functions of its module (`imported.Namespace.scope`).
            scope = getattr(fn.functions, "scope", None)
            functions = scope(node.func.id) if scope is not None else fn.functions
            callee = Function(fn.functions[node.func.id], False, fn.qualname, {}, functions, fn.api)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in owners
            and node.func.attr in static
        ):
            tree = static[node.func.attr]
            callee = Function(tree, False, fn.qualname, fn.siblings, fn.functions, fn.api, class_name=fn.class_name)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id not in shadowed
            and module_function(fn, node.func) is not None
        ):
            # `rope.rotate_half(x)`: the function of a module the file imports (`imported.Namespace`).
            name = module_function(fn, node.func)
            callee = Function(fn.functions[name], False, fn.qualname, {}, fn.functions.scope(name), fn.api)
        if callee is not None:
            bound = bind_arguments(callee.tree, node)
            if bound is not None:
                try:
                    body = inline_functions(callee, fold(callee, inlined=True, unpack=True), depth + 1)
                except NotStraightLine:
                    return substitute_children(node, visit)
                return substitute(body, {name: visit(value) for name, value in bound.items()})
        unpacked = getattr(node, "npu_unpacked", None)
        if unpacked is not None:
            # `q_embed, k_embed = apply_rotary(q, k, ...)` (`fold` with `unpack`): the item of the tuple the
            # helper's body builds, of as many items as the names; anything else is not read (unpacking an
            # iterable is no subscript of it).
            value = visit(node.value)
            if not (
                isinstance(value, ast.Tuple)
                and len(value.elts) == unpacked
                and not any(isinstance(e, ast.Starred) for e in value.elts)
            ):
                raise NotStraightLine(
                    f"it unpacks what `{ast.unparse(node.value.func)}` returns (not a tuple it builds)"
                )
            return value.elts[node.slice.value]
        return substitute_children(node, visit)

    return visit(expr)


def module_function(fn: Function, func: ast.expr) -> str | None:
    """`rope.rotate_half` where `func` calls the function of a module the file imports that the inliner
    can read (`imported.Namespace`, which only that reads), else None."""
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and hasattr(fn.functions, "scope")
        and f"{func.value.id}.{func.attr}" in fn.functions
    ):
        return None
    return f"{func.value.id}.{func.attr}"


def bind_arguments(tree: ast.FunctionDef, call: ast.Call) -> dict[str, ast.expr] | None:
    """Each parameter of `tree` with what `call` passes for it (by position or keyword) or its default, when
    that default is a constant (a default expression is evaluated once, where the helper is defined); None
    where the call cannot be bound so (`*args`, `**kwargs`, a default that is not a constant)."""
    args = tree.args
    if args.vararg or args.kwarg or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    positional = [*args.posonlyargs, *args.args]
    if len(call.args) > len(positional):
        return None
    bound = {a.arg: value for a, value in zip(positional, call.args)}
    by_keyword = {a.arg for a in (*args.args, *args.kwonlyargs)}
    for keyword in call.keywords:
        if keyword.arg is None or keyword.arg not in by_keyword or keyword.arg in bound:
            return None
        bound[keyword.arg] = keyword.value
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for param, default in [*zip(positional, defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
        if param.arg in bound:
            continue
        constant = default.operand if isinstance(default, ast.UnaryOp) else default
        if not isinstance(constant, ast.Constant):
            return None
        bound[param.arg] = default
    return bound


def contains_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in walk_shared(node))


def replace_nodes(node: ast.AST, replacements: dict[int, ast.AST]) -> ast.AST:
    """`node` with the subtrees in `replacements` (by identity) swapped; shared subtrees stay shared."""
    memo: dict[int, ast.AST] = {}

    def visit(n: ast.AST) -> ast.AST:
        if id(n) in replacements:
            return replacements[id(n)]
        if id(n) not in memo:
            memo[id(n)] = substitute_children(n, visit)
        return memo[id(n)]

    return visit(node)


@dataclass
class Path:
    """One way through a function's `if`s on its parameters (`parameter_paths`): the tests as they hold on
    it (`not` put in for the sides not taken), and the function as if its body were that path's statements."""

    conditions: list[ast.expr]
    function: Function


#: A function with more ways through its parameter tests than this is not split (each is folded and run).
PATH_LIMIT = 8


def parameter_paths(fn: Function, reads: Callable[[ast.expr], bool] | None = None) -> list[Path] | None:
    """The straight-line functions `fn` is, one per way through its `if`s whose tests read only parameters
    the body never rebinds, compared with constants (diffusers' `if use_real:`, `if sequence_dim == 2:`): a
    test a branch in front of the body may evaluate again, with the same outcome, and no side effect. A
    path that ends in `raise` is left out (the original raises there: nothing to fuse). None when no such
    `if` is at the top level of the body or there are more than `PATH_LIMIT` paths.

    `reads`, when given, says which attribute reads a test may make besides (`ways.stable_reads`: the
    module's own flags, `self.weight.dtype`, `torch.float16`); without it a test reads no attribute."""
    args = fn.tree.args
    params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} - {fn.self_name}
    rebound = {name for names in fn.stores for name in names}
    body = body_statements(fn.tree)
    test_ok = functools.partial(_parameter_test, params=params - rebound, reads=reads)
    if not any(isinstance(s, ast.If) and test_ok(s.test) for s in body):
        return None
    found: list[tuple[list[ast.expr], list[ast.stmt]]] = []

    def walk(statements: list[ast.stmt], conditions: list[ast.expr]) -> bool:
        for at, stmt in enumerate(statements):
            if isinstance(stmt, ast.Raise):
                return True  # the original raises: no path
            if isinstance(stmt, ast.Return):
                statements = statements[: at + 1]
                break
            if isinstance(stmt, ast.If) and test_ok(stmt.test):
                rest = statements[at + 1 :]
                for side, test in ((stmt.body, stmt.test), (stmt.orelse, negated(stmt.test))):
                    if len(found) > PATH_LIMIT or not walk([*statements[:at], *side, *rest], [*conditions, test]):
                        return False
                return True
        found.append((conditions, statements))
        return len(found) <= PATH_LIMIT

    if not walk(list(body), []) or not found:
        return None
    paths = []
    for conditions, statements in found:
        tree = copy.copy(fn.tree)
        tree.body = statements
        paths.append(Path(_simplified(conditions), fn.around(tree)))
    return paths


def _parameter_test(test: ast.expr, params: set[str], reads: Callable[[ast.expr], bool] | None = None) -> bool:
    """Names of `params`, constants, comparisons, `and` / `or` / `not` of them: nothing that calls or reads
    an attribute, which could compute something else the second time (but the attributes `reads` accepts)."""
    if isinstance(test, ast.Name):
        return test.id in params
    if isinstance(test, ast.Constant):
        return True
    if isinstance(test, ast.Attribute):
        return reads is not None and reads(test)
    if isinstance(test, ast.UnaryOp):
        return isinstance(test.op, (ast.Not, ast.USub)) and _parameter_test(test.operand, params, reads)
    if isinstance(test, ast.BoolOp):
        return all(_parameter_test(v, params, reads) for v in test.values)
    if isinstance(test, ast.Compare):
        parts = [test.left, *test.comparators]
        read = (ast.Name,) if reads is None else (ast.Name, ast.Attribute)
        # a list of dtypes (`in [torch.float16, torch.bfloat16]`) only where attribute reads are allowed
        literal = (ast.Tuple,) if reads is None else (ast.Tuple, ast.List)
        return any(isinstance(p, read) for p in parts) and all(
            _parameter_test(p, params, reads)
            or isinstance(p, literal)
            and all(
                isinstance(e, ast.Constant) or reads is not None and _parameter_test(e, params, reads) for e in p.elts
            )
            for p in parts
        )
    return False


_OPPOSITE = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}  # not the orderings: `a >= b` is not `not a < b` for NaN, sets or a class of one's own


def negated(test: ast.expr) -> ast.expr:
    """`test` false, as one would write it: `a != b` for `a == b`, `flag` for `not flag`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPPOSITE:
        return ast.Compare(test.left, [_OPPOSITE[type(test.ops[0])]()], test.comparators)
    return ast.UnaryOp(ast.Not(), test)


def _simplified(conditions: list[ast.expr]) -> list[ast.expr]:
    """Without `p != a` where another condition says `p == b` for a constant b other than a (an `elif` after
    an `if` on one parameter): implied by it."""

    def constant(c: ast.expr, op: type) -> tuple[str, object] | None:
        if isinstance(c, ast.Compare) and isinstance(c.left, ast.Name) and [type(o) for o in c.ops] == [op]:
            try:  # a number, `-1` too (a unary minus of a constant)
                value = ast.literal_eval(c.comparators[0])
            except ValueError:
                return None
            return (c.left.id, value) if isinstance(value, (int, str, bool)) or value is None else None
        return None

    equal = dict(filter(None, (constant(c, ast.Eq) for c in conditions)))
    implied = [
        c
        for c in conditions
        if (found := constant(c, ast.NotEq)) is not None
        and found[0] in equal
        and type(equal[found[0]]) is type(found[1])
        and equal[found[0]] != found[1]
    ]
    return [c for c in conditions if not any(c is i for i in implied)]
