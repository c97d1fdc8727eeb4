"""`positions_of` must give exactly what libcst's PositionProvider gives, for any node it is asked about,
whether or not the nodes around it were asked about too."""

from __future__ import annotations

import random

import hypothesmith
import libcst as cst
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from libcst.metadata import MetadataWrapper, PositionProvider

from npu_migrate.engine.positions import positions_of

_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)

SAMPLES = {
    "decorators_and_comments": '''\
# header comment

import torch  # trailing
from torch import (  # open paren comment
    nn,
    cuda as c,
)


@decorator
@other.decorator(arg=1)  # comment after a decorator
# comment between decorator and def
def f(a, /, b: int = (1 + 2), *args, c, **kw) -> "T":
    """Docstring
    spanning lines."""
    x = (  # why
        a
        + b
    )
    return ((x))
''',
    "nested_classes_async_fstrings": """\
class Outer(Base, metaclass=Meta):
    class Inner:
        attr: int = 1

        async def run(self, x):
            async with lock as held, other():
                async for item in aiter(x):
                    await item
            return f"{x!r:>{width}} and {self.attr + 1=}"

    def method(self):  # comment
        return [i for i in range(3) if i] or {k: v for k, v in ()}
""",
    "control_flow": """\
if a:
    pass
elif b:  # elif comment
    x = 1; y = 2
elif c: z = 3
else:
    for i in range(3):
        continue
    else:
        break
while True:
    try:
        raise ValueError from None
    except (ValueError, TypeError) as exc:
        del exc
    else:
        pass
    finally:
        global g
    try:
        pass
    except* OSError:
        pass
with open(p) as f, \\
        open(q) as h:
    lambda: (yield)
match command:
    case [x, *rest] if x > 0:
        pass
    case {"k": v, **others}:
        pass
    case Point(x=0) | None:
        pass
    case _:
        pass
""",
    "strings_and_continuations": """\
s = '''multi
line
string'''
t = ("implicit"
     "concatenation" r'raw\\n' f"{x}")
u = 1 + \\
    2
v = x[1:2, ::3, ...]
w = (y := 5)
print(*a, **b)
assert x, "message"
""",
    "tabs": "def f():\n\tif x:\n\t\treturn 1\n\telse:\n\t\treturn (\n\t\t\t2\n\t\t)\n",
    "crlf": "import os\r\n\r\ndef f():\r\n    s = '''a\r\nb'''\r\n    return (1,\r\n            2)\r\n",
    "lone_cr": "x = 1\ry = (2,\r     3)\rdef g():\r    pass\r",
    "no_trailing_newline": "x = 1\nif x:\n    y = 2",
    "form_feed_and_semicolons": "x = 1\n\x0c\ndef f(): return 1; \n",
    # What notebooks.join_cells feeds the pipeline: cells one after the other, magics commented out.
    "notebook_like": """\
# %% [cell 1]
import torch
# npu-migrate magic: %matplotlib inline
model = torch.nn.Linear(2, 2).cuda()

# %% [cell 2]
out = model(torch.ones(2).cuda())
out
""",
    "empty": "",
    "only_comments": "# nothing\n\n# here\n",
}


def _reference(module: cst.Module):
    return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)


def _module(name: str) -> cst.Module:
    return cst.parse_module(SAMPLES[name])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_node_at_once(name):
    module = _module(name)
    reference = _reference(module)
    assert positions_of(module, reference) == dict(reference)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_node_on_its_own(name):
    # Asked alone, a node whose range is hoisted from a child (IndentedBlock, If, SimpleStatementLine)
    # must still find that child's position.
    module = _module(name)
    reference = _reference(module)
    for node, expected in reference.items():
        assert positions_of(module, [node]) == {node: expected}, cst.Module(body=[]).code_for_node(node)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_statements(name):
    module = _module(name)
    reference = _reference(module)
    expected = {node: r for node, r in reference.items() if isinstance(node, _STATEMENTS)}
    assert positions_of(module, statements=True) == expected
    # The nodes asked for come back alongside the statements.
    names = [node for node in reference if isinstance(node, cst.Name)]
    both = positions_of(module, names, statements=True)
    assert both == {**expected, **{node: reference[node] for node in names}}


def test_statements_include_elif_and_nested_ones():
    module = _module("control_flow")
    spans = positions_of(module, statements=True)
    elifs = [node for node in spans if isinstance(node, cst.If) and node is not module.body[0]]
    assert [(r.start.line, r.end.line) for node, r in spans.items() if node in elifs] == [(3, 10), (5, 10)]
    # `elif c: z = 3` is a SimpleStatementSuite, no line of its own; `else` / `except` / `case` are parts
    # of their statements.
    assert sum(isinstance(node, cst.SimpleStatementLine) for node in spans) == 15
    assert sorted(type(node).__name__ for node in spans if not isinstance(node, cst.SimpleStatementLine)) == [
        "For",
        "If",
        "If",
        "If",
        "Match",
        "Try",
        "TryStar",
        "While",
        "With",
    ]


def test_nodes_outside_the_module_and_nothing_asked():
    module = _module("control_flow")
    stranger = cst.Name("x")
    assert positions_of(module, [stranger]) == {}
    assert positions_of(module, []) == {}
    assert positions_of(module, [module]) == {module: _reference(module)[module]}


def test_cr_and_lf_in_neighbouring_tokens_are_two_line_breaks():
    # Never produced by the parser (it reads "\r\n" as one newline), but a built tree can: PositionProvider
    # counts per token, so the "\r" ending one token and the "\n" starting the next are two breaks.
    statement = cst.SimpleStatementLine(
        [cst.Expr(cst.Name("a"))], trailing_whitespace=cst.TrailingWhitespace(newline=cst.Newline("\r"))
    )
    second = cst.SimpleStatementLine(
        [cst.Expr(cst.Name("b"))],
        leading_lines=[cst.EmptyLine(newline=cst.Newline("\n"))],
        trailing_whitespace=cst.TrailingWhitespace(newline=cst.Newline("\r\n")),
    )
    module = cst.Module(body=[statement, second])
    assert module.code == "a\r\nb\r\n"  # one "\r\n" to a text scan: "b" would be on line 2
    reference = _reference(module)
    assert reference[second.body[0]].start.line == 3
    assert positions_of(module, reference) == dict(reference)


def _all_nodes(module: cst.Module):
    return list(_reference(module))


@given(hypothesmith.from_grammar(auto_target=False), st.randoms(use_true_random=False))
def test_random_programs_random_subsets(source, rng: random.Random):
    try:
        module = cst.parse_module(source)
    except Exception:
        assume(False)
    reference = _reference(module)
    nodes = list(reference)
    wanted = rng.sample(nodes, k=rng.randint(0, len(nodes)))
    statements = rng.random() < 0.5
    expected = {node: reference[node] for node in wanted}
    if statements:
        expected.update((node, r) for node, r in reference.items() if isinstance(node, _STATEMENTS))
    assert positions_of(module, wanted, statements=statements) == expected


@given(
    st.sampled_from(sorted(SAMPLES)),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.sampled_from(["    ", "\t", "  "]),
)
def test_samples_in_other_newline_and_indent_styles(name, newline, indent):
    source = SAMPLES[name].replace("\r\n", "\n").replace("\r", "\n").replace("    ", indent)
    try:
        module = cst.parse_module(source.replace("\n", newline))
    except cst.ParserSyntaxError:
        assume(False)
    reference = _reference(module)
    assert positions_of(module, reference) == dict(reference)
