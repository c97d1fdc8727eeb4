"""Machine-readable reports: `--format sarif` validated against the official SARIF 2.1.0 schema
(tests/data/sarif-schema-2.1.0.json, from oasis-tcs/sarif-spec), and `--format github` annotations."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys

import jsonschema
import pytest
from conftest import ROOT

from npu_migrate.findings import Finding, Severity
from npu_migrate.output.report import sarif_document

SCHEMA_PATH = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"
FIXABLE_SOURCE = "import torch\nx = torch.ones(1).cuda()\n"
# NPU204 is report-only: the capability tuple does not exist on NPU, a human has to rework this.
REPORT_ONLY_SOURCE = "import torch\n\nmajor = torch.cuda.get_device_properties(0).major\n"


def run_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "npu_migrate", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)  # the schema says draft-04
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(FIXABLE_SOURCE)
    (tmp_path / "src" / "caps.py").write_text(REPORT_ONLY_SOURCE)
    return tmp_path


def test_schema_file_is_the_official_sarif_2_1_0_schema(validator):
    schema = validator.schema
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    assert isinstance(validator, jsonschema.Draft4Validator)
    assert schema["properties"]["version"]["enum"] == ["2.1.0"]
    assert schema["required"] == ["version", "runs"]
    assert {"run", "result", "region", "reportingDescriptor", "toolComponent"} <= set(schema["definitions"])


@pytest.fixture
def sarif(project):
    before = {p: p.read_bytes() for p in project.rglob("*.py")}
    result = run_cli("apply", "--check", "--format", "sarif", "src", cwd=project)
    assert result.returncode == 1, result.stderr  # train.py would change
    assert {p: p.read_bytes() for p in project.rglob("*.py")} == before  # --check writes nothing
    return json.loads(result.stdout)  # stdout is the document and nothing else


def test_sarif_output_validates_against_the_schema(sarif, validator):
    errors = sorted(validator.iter_errors(sarif), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_sarif_output_content(sarif):
    assert sarif["version"] == "2.1.0"
    (run,) = sarif["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "npu-migrate"
    rule_ids = [rule["id"] for rule in driver["rules"]]
    assert len(rule_ids) == len(set(rule_ids))

    by_rule = {}
    for res in run["results"]:
        by_rule.setdefault(res["ruleId"], []).append(res)
        # ruleIndex must point at the matching rule descriptor.
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
    assert {"NPU001", "NPU101", "NPU204"} <= set(by_rule)

    (cuda_call,) = by_rule["NPU101"]
    loc = cuda_call["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "src/train.py"
    assert loc["region"] == {"startLine": 2, "startColumn": 5}
    assert cuda_call["level"] == "note"  # fixed by the rewrite
    assert ".npu()" in cuda_call["message"]["text"]

    (capability,) = by_rule["NPU204"]
    loc = capability["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "src/caps.py"
    assert loc["region"]["startLine"] == 3
    assert capability["level"] == "error"  # report-only: a human must act
    assert "get_device_properties" in capability["message"]["text"]


def test_a_findings_data_is_its_results_property_bag(validator):
    with_data = Finding("NPU204", "a.py", 3, 1, "m", Severity.WARNING, data={"kernel": "npu_rms_norm", "inputs": 2})
    without = Finding("NPU101", "a.py", 4, 1, "n", Severity.INFO, fixed=True)
    document = sarif_document([with_data, without])
    assert validator.is_valid(document)
    results = document["runs"][0]["results"]
    assert results[0]["properties"] == {"kernel": "npu_rms_norm", "inputs": 2}
    assert "properties" not in results[1]  # no empty bags


@pytest.mark.parametrize(
    "breakage",
    [
        pytest.param(lambda d: d.pop("version"), id="missing-version"),
        pytest.param(lambda d: d.__setitem__("version", "2.0.0"), id="wrong-version"),
        pytest.param(lambda d: d["runs"][0]["results"][0].pop("message"), id="result-without-message"),
        pytest.param(
            lambda d: d["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"].__setitem__(
                "startLine", 0
            ),
            id="line-zero",
        ),
        pytest.param(lambda d: d["runs"][0]["results"][0].__setitem__("level", "fatal"), id="bad-level"),
    ],
)
def test_validator_rejects_broken_documents(sarif, validator, breakage):
    broken = copy.deepcopy(sarif)
    breakage(broken)
    assert not validator.is_valid(broken)


GITHUB_LINE = re.compile(
    r"^::(?P<level>error|warning|notice) file=(?P<file>[^,]+),line=(?P<line>\d+),col=(?P<col>\d+),"
    r"title=(?P<title>NPU\d{3}(?: \(fixable\))?)::(?P<message>.+)$"
)


def test_github_annotations(project):
    result = run_cli("apply", "--check", "--format", "github", "src", cwd=project)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines, result.stderr
    parsed = []
    for line in lines:
        match = GITHUB_LINE.match(line)
        assert match, f"not a workflow command: {line!r}"
        parsed.append(match.groupdict())

    by_title = {p["title"]: p for p in parsed}
    capability = by_title["NPU204"]
    assert capability["level"] == "error"
    assert (capability["file"], capability["line"], capability["col"]) == ("src/caps.py", "3", "9")
    assert "get_device_properties" in capability["message"]

    cuda_call = by_title["NPU101 (fixable)"]
    assert cuda_call["level"] == "notice"
    assert (cuda_call["file"], cuda_call["line"], cuda_call["col"]) == ("src/train.py", "2", "5")
    assert by_title["NPU001 (fixable)"]["level"] == "notice"
    # The summary goes to stderr; stdout holds annotations only.
    assert "files scanned" in result.stderr
