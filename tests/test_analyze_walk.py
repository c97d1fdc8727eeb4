"""Issue #26: the modes' scanners walk with `project.Visitor` and `project.walk`, cheaper stand-ins for
`ast.NodeVisitor` and `ast.walk`. A report is only the same if they visit the same nodes in the same
order, so each is checked against the stdlib on code with every kind of field (lists, optional nodes,
missing fields, constants, nested scopes), and the scanners' subclasses must still dispatch their own
`visit_*` (each class its own table).
"""

from __future__ import annotations

import ast

import pytest

from npu_migrate.analyze.project import Visitor, walk

SAMPLE = '''
import torch, os.path as p
from . import x as y

@decorator(1, k=2)
class Model(torch.nn.Module, metaclass=Meta):
    """doc"""
    x: int = 3

    def forward(self, a, /, b=None, *args, c: float = 1.0, **kw) -> torch.Tensor:
        global G
        for i, (j, k) in enumerate(zip(a, b)):
            if i and not j or k is None:
                continue
            while True:
                break
        else:
            pass
        try:
            h = [v * 2 for v in a if v] + {k: v for k, v in kw.items()} | {1, 2}
        except (ValueError, TypeError) as exc:
            raise RuntimeError("no") from exc
        finally:
            del h
        with torch.no_grad(), open(p) as f:
            y = lambda z, *w: z[1:2, ::3] @ w
        match a:
            case [1, *rest] if rest:
                pass
            case {"k": v, **more}:
                pass
            case Point(x=0) | None:
                pass
        return f"{a!r:>{b}}" if a else ...

async def run(q):
    async with q as r:
        async for s in r:
            await s
    yield from q
    t = yield
    return (t := 1), -t, ~t, b"x", 1j, None, True
'''


def _pairs_stdlib(tree: ast.AST) -> list[tuple[str, str]]:
    seen = []

    class Recorder(ast.NodeVisitor):
        def generic_visit(self, node):
            seen.append(("generic", type(node).__name__))
            super().generic_visit(node)

        def visit_Call(self, node):
            seen.append(("call", ast.dump(node.func)))
            self.generic_visit(node)

        def visit_Name(self, node):
            seen.append(("name", node.id))

    Recorder().visit(tree)
    return seen


def _pairs_ours(tree: ast.AST) -> list[tuple[str, str]]:
    seen = []

    class Recorder(Visitor):
        def generic_visit(self, node):
            seen.append(("generic", type(node).__name__))
            super().generic_visit(node)

        def visit_Call(self, node):
            seen.append(("call", ast.dump(node.func)))
            self.generic_visit(node)

        def visit_Name(self, node):
            seen.append(("name", node.id))

    Recorder().visit(tree)
    return seen


def test_visitor_visits_what_the_stdlib_visits_in_its_order() -> None:
    tree = ast.parse(SAMPLE)
    assert _pairs_ours(tree) == _pairs_stdlib(tree)
    assert len(_pairs_ours(tree)) > 200


def test_each_visitor_class_dispatches_its_own_methods() -> None:
    # The method table is per class: a second scanner with other `visit_*` must not reuse the first's.
    tree = ast.parse("f(x)")
    calls, names = [], []

    class Calls(Visitor):
        def visit_Call(self, node):
            calls.append(node)

    class Names(Visitor):
        def visit_Name(self, node):
            names.append(node.id)

    Calls().visit(tree)
    Names().visit(tree)
    assert len(calls) == 1 and names == ["f", "x"]


def test_walk_yields_what_ast_walk_yields_in_its_order() -> None:
    tree = ast.parse(SAMPLE)
    assert [id(n) for n in walk(tree)] == [id(n) for n in ast.walk(tree)]
    function = tree.body[2].body[2]  # forward
    assert isinstance(function, ast.FunctionDef)
    assert [id(n) for n in walk(function)] == [id(n) for n in ast.walk(function)]


def test_a_missing_field_is_skipped_as_the_stdlib_skips_it() -> None:
    # A node built by hand may lack a field; `iter_fields` skips it, and so must we.
    call = ast.Call(func=ast.Name(id="f", ctx=ast.Load()), args=[ast.Name(id="x", ctx=ast.Load())])
    if hasattr(call, "keywords"):  # set to [] by the constructor from Python 3.13
        del call.keywords
    assert [type(n).__name__ for n in walk(call)] == [type(n).__name__ for n in ast.walk(call)]
    assert _pairs_ours(call) == _pairs_stdlib(call)


def test_a_node_without_fields_is_visited_when_a_scanner_asks_for_it() -> None:
    # `Load` and the like are skipped only where their visit would do nothing.
    stores = []

    class Stores(Visitor):
        def visit_Store(self, node):
            stores.append(node)

    Stores().visit(ast.parse("a = b; c, d = e"))
    assert len(stores) == 4  # a, (c, d), c, d


def test_a_scanner_may_not_override_visit() -> None:
    # `generic_visit` dispatches itself, so an overridden `visit` would be bypassed below the root.
    with pytest.raises(TypeError):

        class Bad(Visitor):
            def visit(self, node):
                return None
