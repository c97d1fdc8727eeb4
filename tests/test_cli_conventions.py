"""What users of ruff and pre-commit expect from a command line: the exit-code contract (--check, --fail-on,
--exit-zero), -h with examples, --quiet, --statistics, --show-fixes, stdin, a run that finds nothing, the
progress bar on a terminal, and `analyze`'s --select/--ignore/--exclude/--mode."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

import pytest
from test_cli import run_cli

CUDA = "import torch\n\nx = torch.ones(2).cuda()\n"
# Migrated already, with one report-only finding left (NPU305, severity error): what the check hook sees
# after npu-migrate-fix has run.
REPORT_ONLY = "import torch\nimport torch_npu\n\nm = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_text(CUDA)
    (tmp_path / "parallel.py").write_text(REPORT_ONLY)
    return tmp_path


# -- exit codes -------------------------------------------------------------------------------------------


def test_check_fails_on_a_rewrite_and_not_on_a_finding_only_a_human_can_act_on(project):
    assert run_cli("apply", "--check", "train.py", cwd=project).returncode == 1
    report_only = run_cli("apply", "--check", "parallel.py", cwd=project)
    assert report_only.returncode == 0, report_only.stderr
    assert "NPU305" in report_only.stdout + report_only.stderr, "the finding is still shown"


def test_fail_on_error_and_warning_make_open_findings_fail(project):
    assert run_cli("apply", "--check", "--fail-on", "error", "parallel.py", cwd=project).returncode == 1
    assert run_cli("apply", "--check", "--fail-on", "warning", "parallel.py", cwd=project).returncode == 1
    # In any mode, not just --check: the threshold is about what is left for a human.
    assert run_cli("apply", "--diff", "--fail-on", "error", "parallel.py", cwd=project).returncode == 1


def test_fail_on_in_the_configuration_and_the_command_line_wins(project):
    (project / "pyproject.toml").write_text('[tool.npu-migrate]\nfail-on = "error"\n')
    assert run_cli("apply", "--check", "parallel.py", cwd=project).returncode == 1
    assert run_cli("apply", "--check", "--fail-on", "rewrite", "parallel.py", cwd=project).returncode == 0


def test_exit_zero_turns_1_into_0_but_never_hides_an_error(project):
    assert run_cli("apply", "--check", "--exit-zero", "train.py", cwd=project).returncode == 0
    assert run_cli("apply", "--check", "--fail-on", "error", "--exit-zero", ".", cwd=project).returncode == 0
    (project / "broken.py").write_text("import torch\nx = torch.ones(1).cuda(\n")
    assert run_cli("apply", "--check", "--exit-zero", ".", cwd=project).returncode == 2


# -- a run that finds nothing -----------------------------------------------------------------------------


def test_a_git_ignored_tree_says_so_and_how_to_include_it(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("generated/\n")
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / "m.py").write_text(CUDA)
    result = run_cli("apply", "--check", "generated", cwd=tmp_path)
    assert result.returncode == 0, "nothing to do is not a failure (a hook whose files are all excluded passes)"
    assert "no file to migrate found under generated" in result.stderr
    assert "1 files ignored by git (pass --no-gitignore" in result.stderr
    assert "0 files scanned" not in result.stderr
    assert run_cli("apply", "--check", "--no-gitignore", "generated", cwd=tmp_path).returncode == 1


def test_an_excluded_or_foreign_tree_says_why_nothing_was_found(tmp_path):
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "m.py").write_text(CUDA)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("cuda\n")
    excluded = run_cli("apply", "--exclude", "vendor", ".", cwd=tmp_path)
    assert "excluded by --exclude" in excluded.stderr
    foreign = run_cli("apply", "docs", cwd=tmp_path)
    assert "npu-migrate reads .py, .ipynb" in foreign.stderr


def test_a_fifo_named_on_the_command_line_is_an_error_for_it_alone(project):
    os.mkfifo(project / "pipe.py")
    result = run_cli("apply", "--diff", "pipe.py", "train.py", cwd=project)
    assert result.returncode == 2
    assert "pipe.py: error: not a regular file" in result.stderr
    assert "+x = torch.ones(2).npu()" in result.stdout, "the other file is still migrated"


# -- output options ---------------------------------------------------------------------------------------


def test_quiet_prints_findings_and_diffs_but_no_summary(project):
    result = run_cli("apply", "--check", "--diff", "-q", ".", cwd=project)
    assert result.returncode == 1
    assert "+x = torch.ones(2).npu()" in result.stdout
    assert "NPU305" in result.stderr
    assert "files scanned" not in result.stderr


def test_statistics_counts_per_rule_instead_of_every_finding(tmp_path):
    for i in range(3):
        (tmp_path / f"p{i}.py").write_text(REPORT_ONLY)
    (tmp_path / "train.py").write_text(CUDA)
    result = run_cli("apply", "--statistics", "--force", ".", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert not any(re.match(r"p\d\.py:\d+:\d+:", line) for line in lines), "no per-finding lines"
    counts = [line for line in lines if re.match(r"^\d+  NPU\d{3}  ", line)]
    assert re.match(r"^3  NPU305  \[open\]  ", counts[0]), "the most frequent rule first"
    assert any(re.match(r"^1  NPU101  \[fixed\] ", line) for line in counts), counts
    assert "4 files scanned, 1 changed" in result.stderr
    assert "needs a human:" not in result.stderr, "the counts are not repeated by the summary"


def test_show_fixes_lists_each_rewrite(project):
    plain = run_cli("apply", "--diff", "train.py", cwd=project)
    shown = run_cli("apply", "--diff", "--show-fixes", "train.py", cwd=project)
    assert "[fixed]" not in plain.stderr and "[fixable]" not in plain.stderr
    # --diff writes nothing: a rewrite it lists is fixable, not fixed (as analyze says it)
    assert "train.py:3:5: NPU101 [fixable] " in shown.stderr
    assert shown.stdout == plain.stdout


# -- stdin ------------------------------------------------------------------------------------------------


def run_stdin(*args, text, cwd):
    return subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", *args],
        input=text,
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_check_names_the_files_and_leaves_the_patch_to_diff(project):
    result = run_cli("apply", "--check", ".", cwd=project)
    assert result.returncode == 1
    assert result.stdout == "", "the patch is --diff's: a CI log of a large tree stays readable"
    assert "would migrate train.py" in result.stderr
    assert "would migrate parallel.py" not in result.stderr, "report-only findings change no file"


def test_stdin_writes_the_migrated_text_to_stdout_and_touches_no_file(tmp_path):
    result = run_stdin("-", "--stdin-filename", "src/train.py", text=CUDA, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "import torch\nimport torch_npu\n\nx = torch.ones(2).npu()\n"
    assert list(tmp_path.iterdir()) == []


def test_stdin_with_diff_and_check(tmp_path):
    diff = run_stdin("-", "--stdin-filename", "train.py", "--diff", text=CUDA, cwd=tmp_path)
    assert diff.stdout.startswith("--- a/train.py\n+++ b/train.py\n"), diff.stdout
    check = run_stdin("-", "--check", text=CUDA, cwd=tmp_path)
    assert check.returncode == 1 and check.stdout == ""
    assert run_stdin("-", "--check", text=REPORT_ONLY, cwd=tmp_path).returncode == 0


def test_stdin_show_fixes_lists_the_rewrites_on_stderr(tmp_path):
    # As ruff's `check --fix --show-fixes -`: stdout is the migrated text alone, the fixes go to stderr.
    plain = run_stdin("-", "--stdin-filename", "train.py", text=CUDA, cwd=tmp_path)
    shown = run_stdin("-", "--stdin-filename", "train.py", "--show-fixes", text=CUDA, cwd=tmp_path)
    assert "[fixed]" not in plain.stderr
    assert "train.py:3:5: NPU101 [fixed] " in shown.stderr
    assert shown.stdout == plain.stdout and ".npu()" in shown.stdout and "NPU101" not in shown.stdout
    # With --diff / --check nothing on stdout is the migrated text: the rewrite is only proposed.
    for mode in ("--diff", "--check"):
        proposed = run_stdin("-", "--stdin-filename", "train.py", mode, "--show-fixes", text=CUDA, cwd=tmp_path)
        assert "train.py:3:5: NPU101 [fixable] " in proposed.stderr, mode
        assert "NPU101" not in proposed.stdout, mode


def test_stdin_filename_decides_the_kind_and_findings_name_it(tmp_path):
    shell = run_stdin("-", "--stdin-filename", "run.sh", text="export CUDA_VISIBLE_DEVICES=0\n", cwd=tmp_path)
    assert shell.stdout == "export ASCEND_RT_VISIBLE_DEVICES=0\n"
    found = run_stdin("-", "--stdin-filename", "par.py", text=REPORT_ONLY, cwd=tmp_path)
    assert found.stdout == REPORT_ONLY
    assert "par.py:4:5: NPU305" in found.stderr


def test_stdin_that_does_not_parse_is_echoed_unchanged_with_an_error(tmp_path):
    broken = "import torch\nx = torch.ones(1).cuda(\n"
    result = run_stdin("-", "--stdin-filename", "b.py", text=broken, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == broken, "an editor replacing its buffer with stdout must lose nothing"
    assert "b.py: error: syntax error" in result.stderr and "Traceback" not in result.stderr


def test_stdin_cannot_be_mixed_with_paths(project):
    result = run_stdin("-", "train.py", text=CUDA, cwd=project)
    assert result.returncode == 2 and "cannot be combined" in result.stderr


# -- help -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["apply"], ["analyze"], ["rules"], ["verify"]])
def test_help_has_examples_and_no_python_types(tmp_path, command):
    short = run_cli(*command, "-h", cwd=tmp_path)
    assert short.returncode == 0, short.stderr
    assert short.stdout == run_cli(*command, "--help", cwd=tmp_path).stdout
    assert re.search(r"Examples:\n +npu-migrate ", short.stdout), short.stdout
    examples = short.stdout.split("Examples:\n")[1].splitlines()
    assert 2 <= len(examples) <= 4
    assert not re.search(r"<(list|int|bool|float|Path|str)\b", short.stdout), short.stdout


def test_a_bad_option_value_is_a_plain_usage_error(tmp_path):
    result = run_cli("apply", "--format", "nope", ".", cwd=tmp_path)
    assert result.returncode == 2
    assert "Invalid value for '--format': 'nope' is not one of 'text'" in result.stderr
    assert "Value error" not in result.stderr and "Traceback" not in result.stderr
    analyze = run_cli("analyze", "--format", "nope", ".", cwd=tmp_path)
    assert analyze.returncode == 2 and "Value error" not in analyze.stderr


# -- progress ---------------------------------------------------------------------------------------------


def with_terminal_stderr(args, *, cwd, stdout) -> bytes:
    """Run npu-migrate with stderr on a pseudo-terminal (stdout where the caller says); what the terminal got."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "npu_migrate", *args],
        cwd=cwd,
        stdout=stdout,
        stderr=slave,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "60"},
    )
    os.close(slave)
    terminal = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        terminal += chunk
    os.close(master)
    assert proc.wait(timeout=300) == 0, terminal
    return terminal


def test_progress_goes_to_a_terminal_stderr_and_the_patch_on_stdout_stays_byte_identical(tmp_path):
    for i in range(12):
        (tmp_path / f"m{i:02d}.py").write_text(f"import torch\nx{i} = torch.ones(1).cuda()\n")
    plain = run_cli("apply", "--diff", ".", cwd=tmp_path)
    patch = tmp_path.parent / f"{tmp_path.name}.patch"
    with patch.open("wb") as stdout:
        terminal = with_terminal_stderr(["apply", "--diff", "."], cwd=tmp_path, stdout=stdout)
    assert patch.read_text() == plain.stdout
    assert b"checking [" in terminal and b"12/12" in terminal
    # The bar never outlives the run: it is cleared before the summary is printed.
    assert terminal.rindex(b"\r\x1b[K") < terminal.index(b"12 files scanned")


def test_analyze_shows_progress_on_a_terminal_too(tmp_path):
    for i in range(4):
        (tmp_path / f"m{i}.py").write_text(CUDA)
    terminal = with_terminal_stderr(["analyze", "--format", "json", "."], cwd=tmp_path, stdout=subprocess.DEVNULL)
    assert b"analysing [" in terminal and b"4/4" in terminal


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text(CUDA)
    result = run_cli("apply", "--diff", ".", cwd=tmp_path)
    assert "checking [" not in result.stderr and "\x1b[K" not in result.stderr


def test_importing_the_cli_loads_no_engine_and_no_heavy_library():
    """Every `npu-migrate` run imports the CLI; what a command needs is imported when it runs (start-up)."""
    code = (
        "import sys, npu_migrate.cli.app\n"
        "print(sorted(m for m in ('libcst', 'jinja2', 'pydantic', 'rich', 'torch', 'numpy', 'yaml') "
        "if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# -- analyze ----------------------------------------------------------------------------------------------


def test_analyze_takes_select_ignore_exclude_and_a_comma_separated_mode(tmp_path):
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "v.py").write_text(REPORT_ONLY)
    (tmp_path / "par.py").write_text(REPORT_ONLY)
    everything = run_cli("analyze", "--format", "json", ".", cwd=tmp_path)
    assert everything.returncode == 0, everything.stderr
    assert "NPU305" in everything.stdout and "vendor/v.py" in everything.stdout
    excluded = run_cli("analyze", "--format", "json", "--exclude", "vendor", ".", cwd=tmp_path)
    assert "vendor/v.py" not in excluded.stdout and "NPU305" in excluded.stdout
    ignored = run_cli("analyze", "--format", "json", "--ignore", "NPU3", ".", cwd=tmp_path)
    assert "NPU305" not in ignored.stdout
    selected = run_cli("analyze", "--format", "json", "--select", "NPU101,NPU2", ".", cwd=tmp_path)
    assert "NPU305" not in selected.stdout
    modes = run_cli("analyze", "--mode", "torch_apis,custom_kernels", "--format", "json", ".", cwd=tmp_path)
    assert modes.returncode == 0, modes.stderr
    bad = run_cli("analyze", "--mode", "torch_apis,nope", ".", cwd=tmp_path)
    assert bad.returncode == 2 and "--mode 'nope': unknown analysis (known: torch_apis" in bad.stderr
