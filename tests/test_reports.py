"""One way from a checker's report to a finding, whatever the kind of checker (libcst `Checker`, `ast`
`TreeChecker`, `TextChecker`): one suppression parser, one `--annotate` path, and the finding's `data`."""

from __future__ import annotations

import ast
import io
import json
import pickle
from pathlib import Path

import pytest

from npu_migrate.engine import markers, registry, scoped
from npu_migrate.engine.checkers import Checker, TreeChecker
from npu_migrate.engine.lines import Suppressions, suppression_comments
from npu_migrate.engine.pipeline import FileResult, Mode, Plan, Status, migrate_source, migrate_text
from npu_migrate.engine.registry import all_checkers, select_rules
from npu_migrate.engine.rule import Example, FixSafety, Rule
from npu_migrate.engine.sites import TextReport, TreeReport
from npu_migrate.engine.textfiles import apply_reports
from npu_migrate.files.source import decode_source
from npu_migrate.findings import Finding, FindingData, Severity
from npu_migrate.output.report import Summary, write_json
from npu_migrate.program.api import NpuApi


def _test_rule(id: str, name: str, **kwargs) -> Rule:
    return Rule(
        id=id,
        name=name,
        family="test",
        summary="test",
        what="test",
        why="test",
        example=Example("def f(): pass"),
        fix_safety=FixSafety.SAFE,
        **kwargs,
    )


WARN_ON_DEFS = _test_rule("NPU799", "test-warning", severity=Severity.WARNING)
NOTE_ON_CALLS = _test_rule("NPU798", "test-note")


class _WarnOnDefs(TreeChecker):
    """A tree checker whose findings a human must act on (the fused rules only report INFO)."""

    rules = (WARN_ON_DEFS,)
    markers = ("def ",)

    def check(self, tree, source, index):
        return [
            TreeReport(self.rules[0], node, "look at this def; it is odd", data={"name": node.name, "args": 1})
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
        ]


class _NoteOnCalls(Checker):
    """A libcst checker that reports every call to `f` with data."""

    rules = (NOTE_ON_CALLS,)
    markers = ("f(",)

    def visit_Call(self, node):
        if getattr(node.func, "value", None) == "f":
            self.report(NOTE_ON_CALLS, node, "a call of f", data={"callee": "f"})


def _migrate(text: str, monkeypatch, *, annotate: bool = False) -> tuple[str, list[Finding]]:
    """`text` through the whole engine, with the two test checkers added to the real ones."""
    monkeypatch.setattr(registry, "all_checkers", lambda: [*all_checkers(), _WarnOnDefs, _NoteOnCalls])
    # Like every checker's, their markers must pass the start-up gate.
    monkeypatch.setattr(markers, "ANY_MARKER", (*markers.ANY_MARKER, *_WarnOnDefs.markers, *_NoteOnCalls.markers))
    plan = Plan(select_rules() | {"NPU799", "NPU798"}, None, Mode.DIFF, annotate=annotate)
    new_text, findings, _ = migrate_source(decode_source(Path("x.py"), text.encode()), "x.py", plan, NpuApi(None))
    return new_text, findings


# -- one suppression parser ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("separator", "comment_line"),
    [
        ("\x0c", 2),  # a form feed is inside a line, to `ast`, libcst, git and editors
        ("\x1c", 2),
        ("\u2028", 2),
        ("\r", 3),  # a lone CR ends a line, for `ast` and libcst as for `str.splitlines`
    ],
)
def test_suppression_comments_are_on_the_lines_the_parsers_count(separator, comment_line):
    text = f"# a{separator}b\nx = 1  # npu-migrate: ignore[npu1, NPU20]\ny = 2  # noqa: NPU3\n"
    assert suppression_comments(text) == [
        (comment_line, frozenset({"NPU1", "NPU20"})),
        (comment_line + 1, frozenset({"NPU3"})),
    ]
    # Without a statement index (a text file) each comment covers its own line only.
    suppressions = Suppressions.scan(text)
    assert suppressions.covers(comment_line, "NPU101") and not suppressions.covers(comment_line, "NPU301")
    assert not suppressions.covers(comment_line - 1, "NPU101")


@pytest.mark.parametrize("separator", ["\x0c", "\r"])
@pytest.mark.parametrize(
    ("path", "prefix", "suppressed", "migrated", "rule"),
    [
        (
            "train.py",
            "import torch\n",
            "x = torch.ones(1).cuda()  # npu-migrate: ignore\n",
            ("y = torch.ones(1).cuda()\n", "y = torch.ones(1).npu()\n"),
            "NPU101",
        ),
        (
            "run.sh",
            "",
            "nvidia-smi  # npu-migrate: ignore\n",
            ("nvidia-smi\n", "npu-smi info\n"),
            "NPU605",
        ),
    ],
)
def test_python_and_text_files_honour_a_comment_after_a_line_separator_alike(
    separator, path, prefix, suppressed, migrated, rule
):
    text = f"{prefix}# one{separator}two\n{suppressed}{migrated[0]}"
    new_text, findings = migrate_text(text, path=path, select=[rule])
    assert new_text == f"{prefix}# one{separator}two\n{suppressed}{migrated[1]}"
    lines = 2 if separator == "\x0c" else 3  # the prefix's comment takes one line, or two after a lone CR
    last = prefix.count("\n") + lines + 1
    assert [(f.rule_id, f.line, f.fixed) for f in findings if f.rule_id == rule] == [(rule, last, True)]


# -- one annotate path -------------------------------------------------------------------------------------

TWO_KINDS = """\
import torch


@torch.no_grad()
def pick():
    if torch.cuda.get_device_properties(0).major >= 8:
        return torch.bfloat16
    return torch.float16
"""


def test_annotate_writes_the_todos_of_both_syntax_trees_once(monkeypatch):
    annotated, findings = _migrate(TWO_KINDS, monkeypatch, annotate=True)
    assert {f.rule_id for f in findings} == {"NPU204", "NPU799"}
    lines = annotated.splitlines()
    # The ast path's TODO goes above the decorator, the libcst path's above the `if` of its finding.
    assert lines[3].startswith("# TODO(npu-migrate NPU799): look at this def (see `npu-migrate rules NPU799`)")
    assert lines[4] == "@torch.no_grad()"
    assert lines[6].startswith("    # TODO(npu-migrate NPU204): `torch.cuda.get_device_properties`")
    assert lines[7] == "    if torch.cuda.get_device_properties(0).major >= 8:"
    assert annotated.count("TODO(npu-migrate") == 2
    again, again_findings = _migrate(annotated, monkeypatch, annotate=True)
    assert again == annotated
    assert [(f.rule_id, f.line) for f in again_findings] == [("NPU799", 6), ("NPU204", 8)]


# -- the finding's data ------------------------------------------------------------------------------------


def test_data_reaches_the_finding_from_each_kind_of_checker(monkeypatch):
    _, findings = _migrate("import torch\n\ndef g():\n    return f(torch.ones(1).cuda())\n", monkeypatch)
    data = {f.rule_id: dict(f.data) for f in findings}
    assert data == {"NPU001": {}, "NPU101": {}, "NPU798": {"callee": "f"}, "NPU799": {"name": "g", "args": 1}}
    text = "nvidia-smi\n"
    _, text_findings = apply_reports(
        text, [TextReport(NOTE_ON_CALLS, 1, 1, "smi", None, (0, 10), "npu-smi info", data={"tool": "smi"})], "r.sh"
    )
    assert [(f.fixed, f.severity, dict(f.data)) for f in text_findings] == [(True, Severity.INFO, {"tool": "smi"})]


def test_data_is_read_only_typed_and_survives_pickling():
    finding = Finding("NPU204", "a.py", 1, 1, "m", Severity.WARNING, data={"kernel": "npu_rms_norm", "inputs": 2})
    assert finding.data == {"kernel": "npu_rms_norm", "inputs": 2} and isinstance(finding.data, FindingData)
    with pytest.raises(TypeError):
        finding.data["kernel"] = "other"
    with pytest.raises(TypeError, match="str to str or int"):
        FindingData({"kernel": 1.5})
    result = FileResult("a.py", Status.UNCHANGED, [finding])
    assert pickle.loads(pickle.dumps(result)).findings == [finding]  # workers send findings back pickled
    assert hash(finding) == hash(pickle.loads(pickle.dumps(finding)))


def test_json_output_has_each_findings_data():
    with_data = Finding("NPU204", "a.py", 3, 1, "m", Severity.WARNING, data={"kernel": "npu_rms_norm", "inputs": 2})
    without = Finding("NPU101", "a.py", 4, 1, "n", Severity.INFO, fixed=True)
    stream = io.StringIO()
    write_json(stream, "apply", [FileResult("a.py", Status.CHANGED, [with_data, without])], Summary())
    document = json.loads(stream.getvalue())
    assert document["schema_version"] == 1
    findings = document["files"][0]["findings"]
    assert [f["data"] for f in findings] == [{"kernel": "npu_rms_norm", "inputs": 2}, {}]


def test_scoped_run_keeps_the_data_and_an_open_reports_severity():
    text = "def f():\n    pass\n"
    _, findings = scoped.run(
        [_WarnOnDefs], ast.parse(text), scoped.Source(text), "x.py", frozenset({"NPU799"}), NpuApi(None)
    )
    assert [(f.severity, f.fixed, dict(f.data)) for f in findings] == [
        (Severity.WARNING, False, {"name": "f", "args": 1})
    ]
