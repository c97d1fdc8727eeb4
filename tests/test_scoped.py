"""Statement-scoped libcst edits (`npu_migrate.engine.scoped`), which the fused-operator rules use.

The oracle: the same fixes applied to the whole module parsed at once, which is what the engine did
before it parsed only the statements it changes. Every layout the splice could get wrong (CRLF, mixed
newlines, two-space and tab indentation, non-ASCII before a call, statements sharing a line, decorators,
a file without a trailing newline) must come out byte-identical to it.
"""

from __future__ import annotations

import ast

import pytest
from conftest import FIXTURES

from npu_migrate.engine import scoped
from npu_migrate.engine.checkers import TreeChecker
from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.findings import Severity

FUSED_INPUTS = sorted(
    p for rule in ("NPU701", "NPU702", "NPU703", "NPU704") for p in (FIXTURES / "rules" / rule).glob("*.in.py")
)

RMS_NORM = """\
import torch
from torch import nn


@torch.no_grad()
def unrelated(x):
    return x


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    @torch.compiler.disable
    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
"""

SDPA = """\
import torch
import torch.nn.functional as F


def attend(q, k, v):
    résultat = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return résultat
"""


def _whole_module(monkeypatch, text: str, select=("NPU7",)) -> str:
    """What the fixes make of `text` when the whole file is one snippet, with the indentation and newline
    libcst detects for it (nothing pinned)."""
    with monkeypatch.context() as patch:
        patch.setattr(scoped, "_blocks", lambda tree: [(1, max(len(scoped.Source(text).lines), 1))])
        patch.setattr(scoped._FileConfig, "pin", lambda self, module: module)
        return migrate_text(text, select=list(select))[0]


def _layouts(text: str):
    yield "as is", text
    yield "crlf", text.replace("\n", "\r\n")
    yield "two spaces", text.replace("    ", "  ")
    yield "tabs", text.replace("    ", "\t")
    yield "no final newline", text.rstrip("\n")
    # The first newline decides the file's newline; the rest are CRLF (the snippets see only CRLF).
    first, _, rest = text.partition("\n")
    yield "mixed newlines", first + "\n" + rest.replace("\n", "\r\n")


@pytest.mark.parametrize("path", FUSED_INPUTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fixtures_scoped_equals_whole_module(path, monkeypatch):
    text = path.read_text(encoding="utf-8")
    for layout, variant in _layouts(text):
        scoped_text = migrate_text(variant, select=["NPU7"])[0]
        assert scoped_text == _whole_module(monkeypatch, variant), layout


@pytest.mark.parametrize("layout", [name for name, _ in _layouts(RMS_NORM)])
def test_layouts_only_insert_lines(layout, monkeypatch):
    variant = dict(_layouts(RMS_NORM))[layout]
    new, findings = migrate_text(variant, select=["NPU7"])
    assert new == _whole_module(monkeypatch, variant)
    assert [f.rule_id for f in findings if f.fixed] == ["NPU701", "NPU701"]
    ast.parse(new)
    old_lines = scoped.Source(variant).lines
    new_lines = scoped.Source(new).lines
    # Every original line is still there, in order and byte for byte: the splice only inserted.
    it = iter(new_lines)
    assert all(any(line == candidate for candidate in it) for line in old_lines[:-1])
    if "\r\n" in variant and "mixed" not in layout:
        assert "\n" not in new.replace("\r\n", "")
    assert migrate_text(new, select=["NPU7"])[0] == new  # idempotent


def test_non_ascii_before_the_call():
    new, findings = migrate_text(SDPA, select=["NPU707"])
    assert "    résultat = _npu_sdpa(q, k, v, is_causal=True)\n" in new
    call = next(f for f in findings if f.line == 6)
    assert call.col == len("    résultat = ") + 1  # characters, not UTF-8 bytes
    assert call.fixed


def test_statements_sharing_a_line_keep_the_prelude_after_them():
    text = RMS_NORM.replace("import torch\nfrom torch import nn\n", "import torch; from torch import nn\n")
    new, _ = migrate_text(text, select=["NPU7"])
    assert new.startswith("import torch; from torch import nn\n\n\ntry:\n    import torch_npu\n")
    ast.parse(new)


def test_findings_of_the_libcst_rules_keep_their_lines_when_both_stages_change_the_file():
    text = RMS_NORM.replace("    return x\n", "    return x.cuda()\n")
    new, findings = migrate_text(text)
    lines = text.splitlines()
    by_rule = {f.rule_id: f for f in findings}
    assert lines[by_rule["NPU101"].line - 1].strip() == "return x.cuda()"
    norm = [f for f in findings if f.rule_id == "NPU701" and f.line > 1]
    assert [lines[f.line - 1].strip() for f in norm] == ["def forward(self, hidden_states):"]
    # One import policy: NPU001's unconditional import serves the fused helpers too, no guarded second one.
    assert new.count("import torch_npu\n") == 1 and "except ImportError" not in new
    assert "return x.npu()" in new and "torch_npu.npu_rms_norm" in new
    assert migrate_text(new)[0] == new


def test_a_statement_libcst_cannot_locate_is_reported_not_rewritten(monkeypatch):
    monkeypatch.setattr(scoped, "_twin", lambda *args: None)
    new, findings = migrate_text(RMS_NORM, select=["NPU7"])
    assert new == RMS_NORM
    assert findings and all(not f.fixed and "not rewritten" in f.message for f in findings)


def test_suppression_comment_on_the_def_line():
    text = RMS_NORM.replace("def forward(self, hidden_states):", "def forward(self, hidden_states):  # noqa: NPU701")
    new, findings = migrate_text(text, select=["NPU7"])
    assert new == text and not findings


class _WarnOnDefs(TreeChecker):
    """A tree checker whose findings a human must act on (the fused rules only report INFO)."""

    rules = (
        Rule(
            id="NPU799",
            name="test-warning",
            family="test",
            summary="test",
            what="test",
            why="test",
            example=Example("def f(): pass", reports="odd"),
            fix_safety=FixSafety.REPORT_ONLY,
            severity=Severity.WARNING,
        ),
    )

    def check(self, tree, source, index):
        return [
            scoped.TreeReport(self.rules[0], node, "look at this def; it is odd")
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
        ]


def test_annotate_puts_a_todo_above_each_open_finding_once():
    text = RMS_NORM.replace("\r\n", "\n")

    def run(t):
        return scoped.run(
            [_WarnOnDefs], ast.parse(t), scoped.Source(t), "x.py", frozenset({"NPU799"}), None, annotate=True
        )

    new, findings = run(text)
    assert len(findings) == 3 and all(not f.fixed for f in findings)
    todo = "# TODO(npu-migrate NPU799): look at this def (see `npu-migrate rules NPU799`)"
    assert new.count(todo) == 3
    # Above the decorators, indented like the def.
    assert f"{todo}\n@torch.no_grad()\ndef unrelated" in new
    assert f"    {todo}\n    @torch.compiler.disable\n    def forward" in new
    assert run(new)[0] == new


def test_fix_pass_walks_only_the_statements_with_fixes_and_falls_back_when_a_fix_is_elsewhere():
    import libcst as cst

    from npu_migrate.engine.fixes import apply_fixes

    module = cst.parse_module("a = 1\n\n@dec(x)\ndef f():\n    return b\n")
    decorator_call = module.body[1].decorators[0].decorator
    rename = lambda node: node.with_changes(func=cst.Name("renamed"))  # noqa: E731
    new, applier = apply_fixes(module, [(decorator_call, rename)], skip=lambda n: n is module.body[0])
    assert new.code == "a = 1\n\n@renamed(x)\ndef f():\n    return b\n"
    assert new.body[0] is module.body[0]  # not walked, not copied
    # Told wrongly to skip the statement holding the fix: the fix still lands.
    new, _ = apply_fixes(module, [(decorator_call, rename)], skip=lambda n: n is module.body[1])
    assert new.code == "a = 1\n\n@renamed(x)\ndef f():\n    return b\n"


def test_module_fixes_apply_after_the_statements_as_in_a_whole_walk():
    import libcst as cst

    from npu_migrate.engine.fixes import apply_fixes

    module = cst.parse_module("import torch\nx = 1\ny = torch.cuda\n")
    seen = []

    def add_import(updated):
        seen.append(updated.code)
        return updated.with_changes(body=[cst.parse_statement("import torch_npu\n"), *updated.body])

    attr = module.body[2].body[0].value
    npu = lambda node: node.with_changes(attr=cst.Name("npu"))  # noqa: E731
    whole, _ = apply_fixes(module, [(attr, npu), (module, add_import)])
    partial, applier = apply_fixes(
        module, [(attr, npu), (module, add_import)], skip=lambda n: n is module.body[0] or n is module.body[1]
    )
    assert partial.code == whole.code == "import torch_npu\nimport torch\nx = 1\ny = torch.npu\n"
    assert seen == ["import torch\nx = 1\ny = torch.npu\n"] * 2  # the module fix saw the fixed statement
    assert applier.results[id(module)] is partial


def test_splice_walks_all_when_the_pruned_walk_misses_a_fix(monkeypatch):
    expected = migrate_text(RMS_NORM, select=["NPU7"])[0]
    monkeypatch.setattr(
        scoped, "skip_statements_apart", lambda spans, positions: lambda node: True
    )  # prunes everything
    assert migrate_text(RMS_NORM, select=["NPU7"])[0] == expected != RMS_NORM


# -- found in review: each case once broke the splice, a position or a suppression ------------------------

#: SDPA calls are rewritten only by the opt-in NPU707 (NPU704 leaves them native).
SDPA_SELECT = ["NPU7", "NPU707"]
SDPA_FUNCTION = "import torch\nimport torch.nn.functional as F\ndef f(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v)\n"


@pytest.mark.parametrize(
    "text",
    [
        SDPA_FUNCTION.replace("\n", "\r"),
        "import torch\rimport torch.nn.functional as F\r\r\ro = F.scaled_dot_product_attention(q, k, v)  # attention\rimport os; os.remove(p)\r",
    ],
)
def test_lone_cr_files_keep_every_line_break(text, monkeypatch):
    new, findings = migrate_text(text, select=SDPA_SELECT)
    assert "\n" not in new and ast.parse(new)
    kept = scoped.Source(new).lines
    assert [line for line in scoped.Source(text).lines if line not in kept and "scaled_dot" not in line] == []
    assert "# attentionimport" not in new and any(f.fixed for f in findings)
    assert migrate_text(new, select=SDPA_SELECT)[0] == new


@pytest.mark.parametrize(
    "header",
    [
        "match x:\n  case 1:\n    pass\n",
        "if x: pass\nelse:\n  y = 1\n",
        "if x: pass\nelif y:\n  z = 1\n",
        "try: y = 1\nexcept E:\n  pass\n",
        "for i in x: pass\nelse:\n  y = 1\n",
    ],
)
def test_the_first_indented_block_sets_the_indent_however_it_is_reached(header, monkeypatch):
    text = SDPA_FUNCTION.replace("def f", header + "def f")
    assert migrate_text(text, select=SDPA_SELECT)[0] == _whole_module(monkeypatch, text, SDPA_SELECT)


def test_form_feed_in_the_first_indentation_is_not_copied_into_generated_code():
    text = SDPA_FUNCTION.replace("def f", "if x:\n\x0c  y = 1\ndef f")
    new, findings = migrate_text(text, select=SDPA_SELECT)
    ast.parse(new)
    assert any(f.fixed for f in findings)


@pytest.mark.parametrize("comment", ["# noqa: NPU707", "# npu-migrate: ignore"])
def test_a_comment_on_line_1_does_not_take_the_helpers_from_the_calls_that_need_them(comment):
    text = SDPA_FUNCTION.replace("import torch\n", f"import torch  {comment}\n", 1)
    new, _ = migrate_text(text, select=SDPA_SELECT)
    assert "_npu_sdpa(" in new and "def _npu_sdpa(" in new and "def _is_npu(" in new


@pytest.mark.parametrize(
    "text, rule, line, col",
    [
        # `import torch_npu` inserted above, `.cuda()` rewritten on the same line as the call
        (
            "import torch\no = torch.nn.functional.scaled_dot_product_attention(q.cuda(), k, v)\nx = y.cuda()\n",
            "NPU704",
            2,
            5,
        ),
        # a rewrite earlier on the line shifts the call's column in the rewritten text
        (
            "import torch\nimport torch.nn.functional as F\no = x.cuda() + F.scaled_dot_product_attention(q, k, v)\n",
            "NPU704",
            3,
            16,
        ),
        # a form feed and a line separator are not line breaks to `ast`
        (
            "import torch\nimport torch.nn.functional as F\n# \x0c\ns = '\u2028'\no = F.scaled_dot_product_attention(q, k, torch.cuda.current_device())\n",
            "NPU704",
            5,
            5,
        ),
    ],
)
def test_fused_findings_point_into_the_original_when_the_libcst_rules_rewrote_first(text, rule, line, col):
    findings = migrate_text(text)[1]
    found = [(f.line, f.col) for f in findings if f.rule_id == rule and "helpers" not in f.message]
    assert found == [(line, col)]
    assert scoped.Source(text).lines[line - 1][col - 1 :].startswith(("torch.nn.functional.scaled", "F.scaled"))


def test_suppression_lines_are_counted_as_ast_counts_them():
    text = "import torch\nimport torch.nn.functional as F\n# \x0c\nx = F.scaled_dot_product_attention(q, k, v)  # noqa: NPU704\n"
    new, findings = migrate_text(text, select=["NPU7"])
    assert new == text and not findings
