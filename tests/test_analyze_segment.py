"""`Source.segment` splits a file's lines once instead of on every call (`ast.get_source_segment` splits the
whole text each time, a fifth of `analyze` on a large tree, #26): it must quote exactly what that function
quotes, for every node, whatever the line endings and characters."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from npu_migrate.analyze.project import Source
from npu_migrate.program.names import Names

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TEXTS = {
    "line endings": "x = (1,\r\n     2)\ry = [3,\n 4]\n\x0cz = 'a\\\r\n b'\n",
    "non-ascii": "s = 'héllo'  # ünïcode\nt = f('ä', 'ß' +\n      'é')\n",
    "no final newline": "def f(a,\n      b):\n    return a + b",
}
FILES = sorted(FIXTURES.rglob("*.in.py"))[:80] + sorted((FIXTURES / "projects").rglob("*.py"))[:40]
CASES = {**TEXTS, **{p.relative_to(FIXTURES).as_posix(): p.read_text(encoding="utf-8") for p in FILES}}


def _source(text: str) -> Source:
    tree = ast.parse(text)
    return Source("m.py", "m", text, tree, Names.of(tree, None), text.splitlines())


@pytest.mark.parametrize(
    "text", [t for t in CASES.values() if t.strip()], ids=[n for n, t in CASES.items() if t.strip()]
)
def test_segment_quotes_what_ast_get_source_segment_quotes(text):
    source = _source(text)
    nodes = [n for n in ast.walk(source.tree) if hasattr(n, "lineno")]
    for node in nodes:
        assert source._segment(node) == (ast.get_source_segment(text, node) or ""), ast.dump(node)[:80]
