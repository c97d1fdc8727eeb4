"""Findings people read (issue #25): severities that say what the user must do, `--min-severity`, the
summary counted by severity, and the one-line answers `apply` gives where it used to print a traceback,
a misleading summary, or nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_cli import run_cli

# A declined fused rewrite (RMSNorm without a weight: NPU701, optional) and a declined device rewrite
# (`.cuda()` in a file with its own `cuda` method: NPU101, the CUDA call is still there).
DECLINED = """\
import torch


def rms(x, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class M(torch.nn.Module):
    def cuda(self):
        return self

    def go(self, t):
        return t.cuda()
"""
CUDA = "import torch\n\nx = torch.ones(2).cuda()\n"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "declined.py").write_text(DECLINED)
    (tmp_path / "train.py").write_text(CUDA)
    return tmp_path


def _severities(project) -> dict[str, str]:
    result = run_cli("apply", "--diff", "--format", "json", "declined.py", cwd=project)
    document = json.loads(result.stdout)
    return {f["rule"]: f["severity"] for file in document["files"] for f in file["findings"]}


def test_a_declined_rewrite_needs_a_human_and_a_declined_fused_kernel_does_not(project):
    # Before: both were "info" and both were listed under "needs a human".
    assert _severities(project) == {"NPU101": "warning", "NPU701": "info"}
    result = run_cli("apply", "--diff", "declined.py", cwd=project)
    assert "NPU101 `.cuda()` not rewritten" in result.stderr
    assert "NPU701" not in result.stderr.split("needs a human")[0], "the optional note is not printed"
    assert "needs a human (0 errors, 1 warning): NPU101 x1\n" in result.stderr
    assert "notes, nothing required (1 info finding" in result.stderr
    assert "--min-severity info lists them): NPU701 x1" in result.stderr


def test_min_severity_chooses_what_is_printed(project):
    every = run_cli("apply", "--diff", "--min-severity", "info", "declined.py", cwd=project)
    assert "declined.py:4:1: NPU701 RMS normalisation not fused" in every.stderr
    assert "not shown" not in every.stderr
    errors = run_cli("apply", "--diff", "--severity", "error", "declined.py", cwd=project)
    assert "declined.py:13:16: NPU101" not in errors.stderr
    assert "needs a human (0 errors, 1 warning)" in errors.stderr, "the summary still counts all"
    # json keeps every finding by default: a program filters for itself
    assert set(_severities(project)) == {"NPU101", "NPU701"}


def test_min_severity_from_the_configuration(project):
    (project / "pyproject.toml").write_text('[tool.npu-migrate]\nmin-severity = "info"\n')
    assert "NPU701 RMS normalisation" in run_cli("apply", "--diff", "declined.py", cwd=project).stderr
    (project / "pyproject.toml").write_text('[tool.npu-migrate]\nmin-severity = "loud"\n')
    bad = run_cli("apply", "--diff", "declined.py", cwd=project)
    assert bad.returncode == 2 and "min-severity: expected one of 'info', 'warning', 'error'" in bad.stderr


def test_fail_on_warning_fails_on_a_declined_rewrite(project):
    assert run_cli("apply", "--check", "--fail-on", "warning", "declined.py", cwd=project).returncode == 1
    assert run_cli("apply", "--check", "--fail-on", "error", "declined.py", cwd=project).returncode == 0


def test_one_file_is_one_file_and_statistics_under_check_fix_nothing(project):
    result = run_cli("apply", "--check", "--statistics", "train.py", cwd=project)
    assert "1 file scanned, 1 would change" in result.stderr
    assert "[fixed]" not in result.stderr and "NPU101  [fixable]" in result.stderr


def test_an_output_that_is_a_file_is_one_line_and_exit_2(project):
    (project / "notes.txt").write_text("mine\n")
    result = run_cli("apply", "train.py", "--output", "notes.txt", cwd=project)
    assert result.returncode == 2
    assert result.stderr == (
        "npu-migrate: error: --output notes.txt is an existing file; --output takes a folder to write the "
        "migrated tree in\n"
    )
    assert (project / "notes.txt").read_text() == "mine\n"


def test_a_missing_path_alone_prints_its_error_and_no_summary(project):
    result = run_cli("apply", "--diff", "missing/", cwd=project)
    assert result.returncode == 2
    assert result.stderr == "missing: error: no such file or directory\n"


def test_a_broken_link_met_while_walking_is_named(project):
    (project / "dead.py").symlink_to(project / "nowhere.py")
    (project / "loop.py").symlink_to(project / "loop.py")
    result = run_cli("apply", "--diff", ".", cwd=project)
    assert "dead.py: warning: broken symbolic link (or a symlink loop); skipped" in result.stderr
    assert "loop.py: warning: broken symbolic link (or a symlink loop); skipped" in result.stderr
    assert result.returncode == 0


def test_check_on_stdin_says_what_check_says_of_a_file(project):
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", "--check", "-"],
        input=CUDA,
        capture_output=True,
        text=True,
        cwd=project,
    )
    assert result.returncode == 1
    assert "would migrate <stdin>" in result.stderr and result.stdout == ""


def test_in_place_outside_git_warns_that_nothing_can_undo_it(project):
    result = run_cli("apply", "train.py", cwd=project)
    assert result.returncode == 0
    assert "warning: train.py is not in a git repository: nothing can undo an in-place migration" in result.stderr
    assert "--output DIR" in result.stderr and "--diff" in result.stderr
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    (project / "other.py").write_text(CUDA)
    inside = run_cli("apply", "other.py", cwd=project)
    assert "not in a git repository" not in inside.stderr


def test_color_always_and_never(project):
    env = {**os.environ}
    env.pop("NO_COLOR", None)
    args = [sys.executable, "-m", "npu_migrate", "apply", "--diff", "train.py"]
    always = subprocess.run([*args, "--color", "always"], cwd=project, capture_output=True, text=True, env=env)
    never = subprocess.run([*args, "--color", "never"], cwd=project, capture_output=True, text=True, env=env)
    assert "\x1b[" in always.stdout and "+import torch_npu" in always.stdout
    assert "\x1b[" not in never.stdout and "+import torch_npu" in never.stdout


# -- analyze ------------------------------------------------------------------------------------------------


def test_analyze_with_output_prints_the_summary_not_the_report(project):
    shown = run_cli("analyze", ".", cwd=project)
    assert "declined.py" in shown.stdout, "without --output the report is the output"
    written = run_cli("analyze", ".", "-o", "rep", cwd=project)
    assert written.returncode == 0 and written.stdout == ""
    assert "reports written to rep" in written.stderr and (project / "rep" / "report.json").is_file()
    asked = run_cli("analyze", ".", "-o", "rep", "--format", "json", cwd=project)
    assert json.loads(asked.stdout)["summary"]
    quiet = run_cli("analyze", ".", "-q", cwd=project)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_analyze_reports_name_code_not_rules_and_set_code_as_code(project):
    assert run_cli("analyze", ".", "--mode", "all", "-o", "rep", "-q", cwd=project).returncode == 0
    rows = (project / "rep" / "affinity_api_call.csv").read_text().splitlines()
    declined = [row for row in rows if ",declined," in row]
    # Before: `declined.py:4:1,4,function,NPU701,...`: the rule id in the code's column.
    assert declined and declined[0].startswith('declined.py:4:1,4,function,"def rms(x, eps=1e-6)",'), rows
    import re

    page = (project / "rep" / "report.html").read_text()
    outside_docs = re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)
    assert "`" not in outside_docs, "raw backticks in the HTML report"
    assert "<code>.cuda()</code> not rewritten" in page


def test_rules_with_a_prefix_lists_that_family(project):
    family = run_cli("rules", "NPU9", cwd=project)
    assert family.returncode == 0
    ids = [line.split()[0] for line in family.stdout.splitlines()]
    assert ids and all(i.startswith("NPU9") for i in ids) and "NPU901" in ids and "NPU951" in ids
    one = run_cli("rules", "NPU101", cwd=project)
    assert one.stdout.startswith("NPU101 (cuda-method)")
    assert run_cli("rules", "NPUX", cwd=project).returncode == 2


def test_annotate_marks_a_declined_rewrite_and_not_an_optional_kernel(project):
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    result = run_cli("apply", "--annotate", "--force", "declined.py", cwd=project)
    assert result.returncode == 0, result.stderr
    text = (project / "declined.py").read_text()
    # Before: neither had a TODO (both were info); the `.cuda()` left in place needs one.
    assert "# TODO(npu-migrate NPU101)" in text and "NPU701" not in text
    assert text.index("# TODO(npu-migrate NPU101)") < text.index("return t.cuda()")
