"""`guards.statements_of` (the statement-only walk NPU803 and the guards read) meets every statement a
walk of the whole libcst tree meets, in the same order."""

from __future__ import annotations

import hypothesmith
import libcst as cst
from hypothesis import example, given, settings

from npu_migrate.program.guards import statements_of

SAMPLE = """
import os
x = 1; y = 2
if a: b = 1; c = 2
elif d:
    e = 3
else:
    f = 4
for i in r:
    g = 5
else:
    h = 6
while w:
    pass
with m() as n:
    try:
        import flash_attn
        HAS = True
    except ImportError:
        HAS = False
    else:
        k = 7
    finally:
        assert x
try:
    pass
except* ValueError:
    z = 1
match v:
    case 1:
        q = 2
    case _:
        if q: raise E
@dec
def f(a=lambda: 1):
    def g():
        return 1
    class C:
        u: int = 1
async def h():
    async with a: async_for = 1
    async for t in s:
        await t
"""


class _All(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            self.found.append(node)
        return True


@settings(max_examples=200, deadline=None)
@given(hypothesmith.from_grammar(auto_target=False))
@example(SAMPLE)
def test_statements_of_meets_what_a_whole_walk_meets(source):
    try:
        module = cst.parse_module(source)
    except Exception:  # noqa: BLE001 (what libcst cannot parse is never walked)
        return
    walk = _All()
    module.visit(walk)
    assert [id(n) for n in statements_of(module)] == [id(n) for n in walk.found]


def test_the_sample_holds_every_kind_of_block():
    kinds = {type(n).__name__ for n in statements_of(cst.parse_module(SAMPLE))}
    assert {"If", "For", "While", "With", "Try", "TryStar", "Match", "FunctionDef", "ClassDef", "Assert"} <= kinds
