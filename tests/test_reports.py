"""One way from a checker's report to a finding, whatever the kind of checker (libcst `Checker`, `ast`
`TreeChecker`, `TextChecker`), and the finding's `data`."""

from __future__ import annotations

import ast
import io
import json
import pickle
from pathlib import Path

import pytest

from npu_migrate import registry, scoped
from npu_migrate.api import NpuApi
from npu_migrate.findings import Finding, FindingData, Severity
from npu_migrate.pipeline import FileResult, Mode, Plan, Status, migrate_source
from npu_migrate.registry import all_checkers, select_rules
from npu_migrate.report import Summary, write_json
from npu_migrate.rule import Checker, Rule, TextReport, TreeChecker, TreeReport
from npu_migrate.source import decode_source
from npu_migrate.textfiles import apply_reports

WARN_ON_DEFS = Rule(id="NPU799", name="test-warning", summary="test", doc="test", severity=Severity.WARNING)
NOTE_ON_CALLS = Rule(id="NPU798", name="test-note", summary="test", doc="test")


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


def _migrate(text: str, monkeypatch) -> tuple[str, list[Finding]]:
    """`text` through the whole engine, with the two test checkers added to the real ones."""
    monkeypatch.setattr(registry, "all_checkers", lambda: [*all_checkers(), _WarnOnDefs, _NoteOnCalls])
    plan = Plan(select_rules() | {"NPU799", "NPU798"}, None, Mode.DIFF)
    new_text, findings, _ = migrate_source(decode_source(Path("x.py"), text.encode()), "x.py", plan, NpuApi(None))
    return new_text, findings


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
