"""Issue #23 (reviewer's defect): NPU703's branch for a rotated width read from the table (ChatGLM / Kolors'
`rot_dim = rope_cache.shape[-2] * 2`) wrote `cache.shape[-2] * 2` five times, the window `x[..., :width]`
three times, and reshaped a copy of x just to read a size that is `width // 2`. The width and the window are
bound once, first thing in the branch after the guard that checks the width, and the size is read from the
view's arguments (`rotary_window`). The numbers of this branch are checked in test_rotary_meaning.py.
"""

from __future__ import annotations

import ast
import textwrap
from collections import Counter

from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text

WIDTH_FROM_TABLE = FIXTURES / "rules" / "NPU703" / "width_from_table.in.py"

#: ChatGLM's partial rotary (Kolors' text encoder), written here, another spelling than the fixture's (other
#: names, the table halves read separately): the rotated width is read from the table's shape, x's sizes from
#: x, the pairs written out, and the rest of the head passed through by a cat. test_rotary_meaning runs its
#: numbers.
WINDOW = textwrap.dedent(
    """
    import torch


    def pair_cache(theta):
        return torch.stack((theta.cos(), theta.sin()), dim=-1)


    def rope_window_from_table(x, cache):
        n = cache.shape[-2] * 2
        rot, rest = x[..., :n], x[..., n:]
        s = x.size(0)
        pairs = rot.reshape(s, -1, x.size(2), n // 2, 2)
        table = cache[:s].view(s, -1, 1, pairs.size(3), 2)
        even = pairs[..., 0] * table[..., 0] - pairs[..., 1] * table[..., 1]
        odd = pairs[..., 0] * table[..., 1] + pairs[..., 1] * table[..., 0]
        return torch.cat([torch.stack((even, odd), dim=-1).flatten(3), rest], -1)
    """
)


def _branch(text: str, function: str) -> ast.If:
    """The `if _is_npu(...)` branch NPU703 put first in `function`."""
    module = ast.parse(text)
    fn = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == function)
    branch = next(s for s in fn.body if isinstance(s, ast.If))
    assert ast.unparse(branch.test).startswith("_is_npu("), ast.unparse(branch)
    return branch


def _repeated(branch: ast.If) -> dict[str, int]:
    """Sub-expressions of 10 or more characters written more than twice in the branch."""
    counts = Counter(ast.unparse(n) for n in ast.walk(branch) if isinstance(n, ast.expr))
    return {text: count for text, count in counts.items() if len(text) >= 10 and count > 2}


def _migrated(source: str) -> str:
    text, findings = migrate_text(source, path="rope.py", select=["NPU703"])
    assert any(f.rule_id == "NPU703" and f.fixed for f in findings), findings
    return text


def test_the_width_from_the_table_and_its_window_are_written_once():
    for source, function in ((WIDTH_FROM_TABLE.read_text(), "rotate_table_width"), (WINDOW, "rope_window_from_table")):
        branch = _branch(_migrated(source), function)
        code = ast.unparse(branch)
        assert not _repeated(branch), (_repeated(branch), code)
        # no copy of x reshaped to read a size the branch states (`_npu_w // 2`)
        assert ".size(3)" not in code and ".reshape(" not in code, code
        assert "_npu_w // 2" in code, code
        # the guard checks the width before anything reads it; the width, then its window, bound first
        assert ast.unparse(branch.test).endswith("and 0 <= cache.shape[-2] * 2 <= x.shape[-1]"), code
        first, second = (ast.unparse(s) for s in branch.body[:2])
        assert first == "_npu_w = cache.shape[-2] * 2", code
        assert second == "_npu_x0 = x[..., :_npu_w]", code
        # the kernel and its check read the bound window, the pass-through part the bound width
        assert code.count("_npu_x0") == 3 and "x[..., _npu_w:]" in code, code


def test_the_fixture_branch_is_readable():
    """The committed fixture (what users see) has the same shape, within the line width."""
    out = (FIXTURES / "rules" / "NPU703" / "width_from_table.out.py").read_text()
    branch = _branch(out, "rotate_table_width")
    assert not _repeated(branch)
    lines = out.splitlines()[branch.lineno - 1 : branch.end_lineno]
    assert max(len(line) for line in lines) <= 120, lines


def test_a_size_the_view_infers_is_still_read_from_the_view():
    """`t.reshape(s, -1, ...).size(1)` is not stated by the arguments (-1 is inferred): it stays a read."""
    source = WINDOW.replace("view(s, -1, 1, pairs.size(3), 2)", "view(s, pairs.size(1), 1, pairs.size(3), 2)")
    code = ast.unparse(_branch(_migrated(source), "rope_window_from_table"))
    assert ".reshape(" in code and ".size(1)" in code, code
    assert ".size(3)" not in code, code
