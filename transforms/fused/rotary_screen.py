"""NPU703's pre-screen: whether a function can hold anything the rotary evaluator would report.

The evaluator (`rotary.match`) folds a function, inlines its helpers and runs every candidate
subexpression abstractly; on a big tree almost every method of a class whose source holds one of the
idiom's markers ("rope" is in "dropout", "sin" in "isinstance") gets that treatment, and almost none is a
rotary embedding (transformers 5.24: 282 outcomes in 14,443 functions). This test reads only the nodes of
the function and of the functions it could inline (module-level functions it calls by name, methods it
calls as attributes, transitively), and is a necessary condition for every outcome `match` can return,
so it drops no site and no finding:

* a fused site, a decline of a close miss, or a rotation multiplied by something (`rotary_sites.sites`,
  `rotary_declines.unmatched_rotation`): `sites` only runs a subexpression holding a product (`*`) and a
  sum, a difference or a join (`rotary_sites._JOINS`), so both must be there;
* a `rotate*` helper multiplied by a table (`rotary_declines.rotate_helper_outcome`): a product and a
  call named `rotate...`;
* a complex rotation on one side of an `if` (`_complex_only_in_a_branch`): `view_as_complex` / `polar`;
* a call that is a rotation in a function that is not straight-line (`pure_rotation` of a call): a
  rotation pairs elements by a join of the halves or pairs (a sum, a difference or a join call) and
  negates one of each pair (a unary minus of something other than a number, a difference, a product,
  `neg` or `sub`).

In a function that passes, `Runs` skips the evaluator's runs of subexpressions it is certain to fail on
(a call it does not model on the way to x), as `rotation.meaning` would answer None for them.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from npu_migrate.transforms.fused.evaluator import KNOWN_FUNCTIONS, KNOWN_METHODS, Evaluation
from npu_migrate.transforms.fused.symbolic import Function, nodes_of

#: Calls that join two terms: `rotary_sites._JOINS` (tests/test_rotary_screen.py checks they agree).
JOINS = frozenset({"cat", "concat", "concatenate", "stack", "view_as_real", "rearrange", "flatten", "reshape", "view"})
#: `torch.add` / `.sub`: what the evaluator reads as `+` / `-`, which join terms too.
_SUMS = frozenset({"add", "sub"})
_NEGATIONS = frozenset({"neg", "negative", "sub", "mul"})
_COMPLEX = frozenset({"view_as_complex", "polar"})

#: What `Evaluation._Call` can run: `cannot_run` reads the evaluator's own tables.
_EVALUATOR_FUNCTIONS, _EVALUATOR_METHODS = KNOWN_FUNCTIONS, KNOWN_METHODS

_PRODUCT, _JOIN, _NEGATION, _ROTATE_CALL, _COMPLEX_CALL = 1, 2, 4, 8, 16


#: A def and the functions its calls by name reach: the file's (`Function.functions`), or for a helper
#: imported from a sibling module, that module's (`imported.Namespace.scope`), as the inliner reads them.
_Callee = tuple[ast.FunctionDef, Mapping[str, ast.FunctionDef]]


class _Scans:
    """Per def of the file being matched: what it holds (`_PRODUCT` ... bits), the module functions it
    calls by name and the attributes it calls (a sibling method, whichever class asks). A module's
    helpers are asked about by every function that calls them: each is scanned once."""

    def __init__(self) -> None:
        self.functions: object = None
        self.found: dict[int, tuple[ast.AST, int, list[_Callee], set[str]]] = {}

    def of(self, fn: Function, callee: _Callee) -> tuple[int, list[_Callee], set[str]]:
        if self.functions is not fn.functions:  # another file: its defs are other trees
            self.functions, self.found = fn.functions, {}
        tree, functions = callee
        # A def is one module's: the table its calls reach is the same whichever caller asks.
        entry = self.found.get(id(tree))
        if entry is None:
            entry = self.found[id(tree)] = (tree, *_scan(fn, nodes_of(tree), functions))
        return entry[1:]


_SCANS = _Scans()


def may_rotate(fn: Function) -> bool:
    """False when no outcome of `rotary.match` is possible for `fn` (see the module's docstring)."""
    flags = _reach(fn)
    if flags & _COMPLEX_CALL:
        return True
    if flags & _PRODUCT and flags & (_JOIN | _ROTATE_CALL):
        return True
    return flags & (_JOIN | _NEGATION) == _JOIN | _NEGATION


def may_hold_site(fn: Function) -> bool:
    """False when `rotary_sites.sites` can find nothing in the folded `fn`, helpers inlined: no product, or
    nothing that sums or joins (the straight tails of a function, `rotary_tail.straight_tail_outcome`)."""
    flags = _reach(fn)
    return bool(flags & _PRODUCT and flags & _JOIN)


def may_be_rotation(expr: ast.expr, fn: Function) -> bool:
    """False when `rotation.pure_rotation` of `expr` (helpers already inlined into it) is None for every x:
    a rotation joins the halves or pairs and negates one of each pair (the last case of the module's
    docstring, asked of one call of a function that is not straight-line: `rotary_sites.rotates`, #26)."""
    flags = _scan(fn, nodes_of(expr), {})[0]
    return flags & (_JOIN | _NEGATION) == _JOIN | _NEGATION


def _reach(fn: Function) -> int:
    """The bits of `fn` and of every def it may inline."""
    flags, callees, attributes = _scan(fn, fn.nodes, fn.functions)
    seen = {id(fn.tree)}
    siblings = fn.siblings
    todo = [*callees, *((siblings[a], fn.functions) for a in attributes if a in siblings)]
    while todo:
        callee = todo.pop()
        if id(callee[0]) in seen:
            continue
        seen.add(id(callee[0]))
        more, called, attributes = _SCANS.of(fn, callee)
        flags |= more
        todo += called
        todo += [(siblings[a], fn.functions) for a in attributes if a in siblings]
    return flags


def _scan(
    fn: Function, nodes: list[ast.AST], functions: Mapping[str, ast.FunctionDef]
) -> tuple[int, list[_Callee], set[str]]:
    """The bits of `nodes`, the module functions they call by name (looked up in `functions`, with the
    table each one's own calls reach), and the attributes they call."""
    flags = 0
    callees = []
    attributes = set()
    scope = getattr(functions, "scope", None)  # an `imported.Namespace`: its imported helpers' own module
    for node in nodes:
        kind = type(node)
        if kind is ast.BinOp:
            op = type(node.op)
            if op is ast.Mult:
                flags |= _PRODUCT | _NEGATION
            elif op is ast.Add:
                flags |= _JOIN
            elif op is ast.Sub:
                flags |= _JOIN | _NEGATION
        elif kind is ast.UnaryOp:
            # `-x2`, not `-1` (`dim=-1`): a number negates a tensor only in a product, counted there.
            if type(node.op) is ast.USub and type(node.operand) is not ast.Constant:
                flags |= _NEGATION
        elif kind is ast.Call:
            func = node.func
            if type(func) is ast.Name:
                name = spelled = func.id
                callee = functions.get(name)
                if callee is not None:
                    callees.append((callee, scope(name) if scope is not None else functions))
                else:
                    # `from torch import cat as join`: the evaluator resolves the alias.
                    qualname = fn.qualname(func)
                    name = qualname.rsplit(".", 1)[-1] if qualname else name
            elif type(func) is ast.Attribute:
                name = spelled = func.attr
                attributes.add(name)
                if scope is not None and type(func.value) is ast.Name:
                    # `rope.rotate_half(x)`: a function of a module the file imports, as the inliner reads it.
                    dotted = f"{func.value.id}.{name}"
                    callee = functions.get(dotted)
                    if callee is not None:
                        callees.append((callee, scope(dotted)))
            else:
                continue
            if name in _COMPLEX:
                flags |= _COMPLEX_CALL
            if name in JOINS or name in _SUMS:
                flags |= _JOIN
            if name in _NEGATIONS:
                flags |= _NEGATION
            if "rotate" in spelled.lower():
                flags |= _ROTATE_CALL
    return flags, callees, attributes


class Runs:
    """Whether the evaluator's run of a subexpression, with x as the rotated tensor, is certain to fail, so
    that `rotation.meaning` and `rotation.pure_rotation` are None without running it (#26: most of what
    `rotary_sites.sites` asks of a big function's folded expression fails on a call the evaluator does not
    model, `self.proj(x)`, on the way to x). Read from the evaluator's own dispatch (`Evaluation.run`,
    its `_<node type>` methods, its tables of functions and methods), and only where that fails whatever
    the values are: a node that reads x and is no table (`_sized_table`) which it has no method for, a
    call whose arguments it runs and then does not know, or a node an operand of which it runs fails so.
    One per expression (and `Structure`): what is known of each x's reads is kept for its subexpressions."""

    def __init__(self, qualname, structure) -> None:
        self.qualname, self.structure = qualname, structure
        self._by_x: dict[int, tuple[Evaluation, dict[int, bool]]] = {}

    def cannot_run(self, node: ast.expr, x: ast.expr) -> bool:
        key = self.structure.of(x)
        found = self._by_x.get(key)
        if found is None:
            found = self._by_x[key] = (Evaluation(x, None, self.qualname, structure=self.structure), {})
        return _fails(*found, node)


def _fails(evaluation: Evaluation, memo: dict[int, bool], node: ast.AST) -> bool:
    found = memo.get(id(node))
    if found is None:
        found = memo[id(node)] = _fails_here(evaluation, memo, node)
    return found


def _fails_here(evaluation: Evaluation, memo: dict[int, bool], node: ast.AST) -> bool:
    if not evaluation.reads_x(node) or evaluation.key(node) in (evaluation.x_key, evaluation.base_key):
        # a constant or a table, x itself, or the tensor x is a window or a moved view of (its sizes are
        # x's, `Evaluation.base_key`): `run` answers without failing for certain
        return False
    if evaluation._sized_table(node):
        return False
    kind = type(node)
    if getattr(Evaluation, f"_{kind.__name__}", None) is None:
        return True  # `run`: "... is not understood"
    if kind is ast.Call:
        # `_Call` runs every argument first, then the method of a tensor receiver (which it must know), or
        # a function it must know; a table's `.view` / `.reshape` may be a table (not decided here).
        for arg in node.args:
            if _fails(evaluation, memo, arg.value if type(arg) is ast.Starred else arg):
                return True
        for keyword in node.keywords:
            if keyword.arg is None or _fails(evaluation, memo, keyword.value):
                return True
        func = node.func
        if type(func) is ast.Attribute and evaluation.reads_x(func.value):
            return func.attr not in _EVALUATOR_METHODS or _fails(evaluation, memo, func.value)
        if type(func) is ast.Attribute and func.attr in ("view", "reshape"):
            return False
        return evaluation.qualname(func) not in _EVALUATOR_FUNCTIONS
    if kind is ast.BinOp:
        return _fails(evaluation, memo, node.left) or _fails(evaluation, memo, node.right)
    if kind is ast.UnaryOp:
        return _fails(evaluation, memo, node.operand)
    if kind is ast.Subscript:
        return _fails(evaluation, memo, node.value) or _index_fails(evaluation, memo, node.slice)
    if kind is ast.Attribute:
        return _fails(evaluation, memo, node.value)
    if kind in (ast.Tuple, ast.List):
        return any(_fails(evaluation, memo, e.value if type(e) is ast.Starred else e) for e in node.elts)
    return False


def _index_fails(evaluation: Evaluation, memo: dict[int, bool], node: ast.AST) -> bool:
    """`Evaluation.index`: a slice's bounds and a tuple's entries are run."""
    if type(node) is ast.Slice:
        return any(p is not None and _fails(evaluation, memo, p) for p in (node.lower, node.upper, node.step))
    if type(node) is ast.Tuple:
        return any(_index_fails(evaluation, memo, e) for e in node.elts)
    return _fails(evaluation, memo, node)
