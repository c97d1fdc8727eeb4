"""The command line as users and CI see it: exit codes, --diff, --check, --output, in-place writes."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

EXAMPLE = ROOT / "examples" / "tiny_cnn"
CUDA_SOURCE = "import torch\n\nx = torch.ones(2).cuda()\ntorch.cuda.synchronize()\n"
PLAIN_SOURCE = "import torch\n\n# runs on cuda or cpu\nx = torch.ones(2)\n"


def run_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "npu_migrate", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(CUDA_SOURCE)
    (tmp_path / "pkg" / "plain.py").write_text(PLAIN_SOURCE)
    (tmp_path / "pkg" / "notes.txt").write_text("not python\n")
    return tmp_path


def snapshot(folder):
    """The tree's files, but for the result cache (`.npu_migrate_cache/`, which a dry run may fill)."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".npu_migrate_cache" not in p.relative_to(folder).parts
    }


def test_diff_writes_nothing_and_applies_with_git_to_the_in_place_result(project, tmp_path_factory):
    before = snapshot(project)
    result = run_cli("apply", "--diff", "pkg", cwd=project)
    assert result.returncode == 0, result.stderr
    assert snapshot(project) == before
    assert result.stdout.startswith("--- a/pkg/train.py\n+++ b/pkg/train.py\n")
    assert "+x = torch.ones(2).npu()" in result.stdout

    # The same tree migrated in place must equal the tree patched with `git apply`.
    patched = tmp_path_factory.mktemp("patched")
    shutil.copytree(project, patched, dirs_exist_ok=True)
    subprocess.run(["git", "init", "-q"], cwd=patched, check=True)
    subprocess.run(["git", "apply", "-"], cwd=patched, input=result.stdout, text=True, check=True)
    in_place = run_cli("apply", "pkg", cwd=project)
    assert in_place.returncode == 0, in_place.stderr
    assert (patched / "pkg" / "train.py").read_bytes() == (project / "pkg" / "train.py").read_bytes()


def test_check_exits_1_when_something_would_change_and_0_when_clean(project):
    assert run_cli("apply", "--check", "pkg", cwd=project).returncode == 1
    assert run_cli("apply", "pkg", cwd=project).returncode == 0
    assert run_cli("apply", "--check", "pkg", cwd=project).returncode == 0


def test_in_place_apply_is_idempotent_and_leaves_clean_files_byte_identical(project):
    run_cli("apply", "pkg", cwd=project)
    first = snapshot(project)
    assert first["pkg/plain.py"] == PLAIN_SOURCE.encode()
    assert b"import torch_npu" in first["pkg/train.py"]
    second = run_cli("apply", "pkg", cwd=project)
    assert second.returncode == 0
    assert snapshot(project) == first


def test_output_writes_a_migrated_copy_and_change_list(project, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "migrated"
    before = snapshot(project)
    result = run_cli("apply", "pkg", "--output", out, cwd=project)
    assert result.returncode == 0, result.stderr
    assert snapshot(project) == before, "the input tree must stay untouched"
    assert (out / "train.py").read_text().count("import torch_npu") == 1
    assert (out / "plain.py").read_bytes() == PLAIN_SOURCE.encode()
    assert (out / "notes.txt").read_text() == "not python\n"
    rows = list(csv.DictReader((out / "change_list.csv").open()))
    assert {(r["file"], r["rule"]) for r in rows} >= {("train.py", "NPU101"), ("train.py", "NPU201")}
    cuda_row = next(r for r in rows if r["rule"] == "NPU101")
    assert (cuda_row["line"], cuda_row["original"], cuda_row["replacement"]) == (
        "3",
        "torch.ones(2).cuda",
        "torch.ones(2).npu",
    )


def test_output_inside_the_input_tree_is_refused(project):
    result = run_cli("apply", "pkg", "--output", "pkg/out", cwd=project)
    assert result.returncode == 2
    assert "inside the input tree" in result.stderr
    assert not (project / "pkg" / "out").exists()


def test_a_broken_file_is_reported_and_the_rest_still_migrated(project):
    (project / "pkg" / "broken.py").write_text("import torch\nx = torch.ones(1).cuda(\n")
    result = run_cli("apply", "pkg", cwd=project)
    assert result.returncode == 2
    assert "pkg/broken.py: error: syntax error" in result.stderr
    assert "Traceback" not in result.stderr
    assert "npu()" in (project / "pkg" / "train.py").read_text()


def test_missing_path_and_unknown_rule_and_version_are_usage_errors(project):
    missing = run_cli("apply", "nope", cwd=project)
    assert missing.returncode == 2 and "nope: error: no such file or directory" in missing.stderr
    bad_rule = run_cli("apply", "--select", "NPU999", "pkg", cwd=project)
    assert bad_rule.returncode == 2 and "unknown rule or prefix 'NPU999'" in bad_rule.stderr
    bad_version = run_cli("apply", "--torch-npu-version", "9.9", "pkg", cwd=project)
    assert bad_version.returncode == 2 and "unknown torch_npu version '9.9'" in bad_version.stderr
    for result in (missing, bad_rule, bad_version):
        assert "Traceback" not in result.stderr


def test_select_and_ignore_limit_the_rewrites(project):
    only_methods = run_cli("apply", "--diff", "--select", "NPU101", "pkg", cwd=project)
    assert "+x = torch.ones(2).npu()" in only_methods.stdout
    assert "torch.npu.synchronize" not in only_methods.stdout
    no_api = run_cli("apply", "--diff", "--ignore", "NPU2,NPU001", "pkg", cwd=project)
    assert "torch.npu.synchronize" not in no_api.stdout and "import torch_npu" not in no_api.stdout


def test_json_format_is_a_versioned_document(project):
    import json

    result = run_cli("apply", "--diff", "--format", "json", "pkg", cwd=project)
    document = json.loads(result.stdout)
    assert document["schema_version"] == 1
    assert document["summary"]["files_changed"] == 1
    [train] = [f for f in document["files"] if f["path"] == "pkg/train.py"]
    assert {f["rule"] for f in train["findings"]} == {"NPU001", "NPU101", "NPU201"}


def test_rules_lists_and_documents_every_rule(project):
    listing = run_cli("rules", cwd=project)
    assert listing.returncode == 0 and "NPU101" in listing.stdout and "NPU204" in listing.stdout
    doc = run_cli("rules", "NPU202", cwd=project)
    assert "Before:" in doc.stdout and "NPUGraph" in doc.stdout
    assert run_cli("rules", "NPU999", cwd=project).returncode == 2


def test_bundled_example_migrates_end_to_end(tmp_path):
    shutil.copytree(EXAMPLE, tmp_path / "example")
    result = run_cli("apply", "example", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    train = (tmp_path / "example" / "train.py").read_text()
    for expected in (
        "import torch_npu\n",
        'parser.add_argument("--device", default="npu"',
        "torch.npu.manual_seed_all(0)",
        "model = TinyConvNet().npu()",
        "images = images.npu(non_blocking=True)",
        'map_location="npu:0"',
        # None on NPU: asked as an Ampere-class GPU (NPU206)
        "(torch.npu.get_device_capability() or (8, 0))[0] >= 8",
    ):
        assert expected in train
    assert "NPU206" in result.stdout + result.stderr
    assert (tmp_path / "example" / "model.py").read_bytes() == (EXAMPLE / "model.py").read_bytes()
    compile(train, "train.py", "exec")


def test_the_tool_never_imports_torch(project):
    """Static by design: migrating must work where torch (and torch_npu) are not installed."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # any `import torch` now raises ImportError\n"
        "sys.argv = ['npu-migrate', 'apply', '--diff', 'pkg']\n"
        "from npu_migrate.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    sys.exit(exc.code)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "+x = torch.ones(2).npu()" in result.stdout


def test_apply_does_not_load_what_only_analyze_and_verify_run(project):
    # `apply --check` runs on every commit in a pre-commit hook: its start-up is paid each time.
    code = (
        "import sys\n"
        "sys.argv = ['npu-migrate', 'apply', '--check', 'pkg/plain.py']\n"
        "from npu_migrate.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print(sorted(m for m in sys.modules if m.startswith(('npu_migrate.analyze', 'npu_migrate.verify'))))\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # analyze.rules: the NPU9xx declarations, which the one rule registry holds (no analysis engine).
    assert result.stdout.strip() == str(
        [
            "npu_migrate.analyze",
            "npu_migrate.analyze.cli",
            "npu_migrate.analyze.rules",
            "npu_migrate.verify",
            "npu_migrate.verify.cli",
        ]
    )


def test_many_files_through_the_process_pool_keep_input_order(tmp_path):
    for i in range(12):
        (tmp_path / f"m{i:02d}.py").write_text(f"import torch\nx{i} = torch.ones(1).cuda()\n")
    result = run_cli("apply", "--diff", "--jobs", "2", ".", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    headers = [line for line in result.stdout.splitlines() if line.startswith("--- a/")]
    assert headers == [f"--- a/m{i:02d}.py" for i in range(12)]


def test_readme_documents_every_rule_family_and_id_range():
    """The README's rule table is written by hand; this keeps it from falling behind the registry."""
    import re

    from npu_migrate.engine.registry import all_rules

    readme = (ROOT / "README.md").read_text()
    ranges = [(int(a), int(b)) for a, b in re.findall(r"NPU(\d{3})-NPU(\d{3})", readme)]
    singles = {int(n) for n in re.findall(r"\| NPU(\d{3}) \|", readme)}
    for rule in all_rules():
        number = int(rule.id[3:])
        assert number in singles or any(a <= number <= b for a, b in ranges), f"{rule.id} missing from README"
