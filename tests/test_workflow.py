"""How npu-migrate fits a team's workflow: configuration, suppression comments, inline TODOs, git safety."""

from __future__ import annotations

import subprocess

import pytest
from test_cli import run_cli

from npu_migrate.engine.pipeline import migrate_text

CUDA = "import torch\n\nx = torch.ones(2).cuda()\ntorch.cuda.synchronize()\n"


# -- suppressions ---------------------------------------------------------------------------------------


def test_suppression_comment_on_a_line_leaves_that_line_alone():
    source = "import torch\nx = torch.ones(1).cuda()  # npu-migrate: ignore\ny = torch.ones(1).cuda()\n"
    migrated, _ = migrate_text(source)
    assert "x = torch.ones(1).cuda()  # npu-migrate: ignore\n" in migrated
    assert "y = torch.ones(1).npu()\n" in migrated


def test_suppression_with_codes_only_silences_those_rules():
    source = "import torch\nx = torch.ones(1, device='cuda').cuda()  # npu-migrate: ignore[NPU101]\n"
    migrated, findings = migrate_text(source)
    assert "x = torch.ones(1, device='npu').cuda()" in migrated
    assert "NPU101" not in {f.rule_id for f in findings}


def test_noqa_with_our_codes_is_honoured_and_a_bare_noqa_is_not():
    source = "import torch\nx = torch.ones(1).cuda()  # noqa: NPU101\ny = torch.ones(1).cuda()  # noqa\n"
    migrated, _ = migrate_text(source)
    assert "x = torch.ones(1).cuda()  # noqa: NPU101" in migrated
    assert "y = torch.ones(1).npu()  # noqa" in migrated


def test_suppression_on_a_block_header_covers_the_block():
    source = (
        "import torch\n\n"
        "def legacy():  # npu-migrate: ignore\n"
        "    torch.cuda.synchronize()\n"
        "    return torch.ones(1).cuda()\n\n"
        "def new():\n"
        "    return torch.ones(1).cuda()\n"
    )
    migrated, _ = migrate_text(source)
    assert "    torch.cuda.synchronize()\n    return torch.ones(1).cuda()\n" in migrated
    assert "def new():\n    return torch.ones(1).npu()\n" in migrated


def test_suppressed_import_is_not_rebound_and_its_uses_stay():
    source = "from torch.cuda import synchronize as sync  # npu-migrate: ignore\nsync()\n"
    migrated, _ = migrate_text(source)
    assert migrated == source


# -- inline TODOs -------------------------------------------------------------------------------------------


def test_annotate_inserts_one_todo_above_each_open_finding_and_is_idempotent():
    source = (
        "import torch\n\n"
        "def pick():\n"
        "    if torch.cuda.get_device_properties(0).major >= 8:\n"
        "        return torch.bfloat16\n"
        "    return torch.float16\n"
    )
    migrated, _ = migrate_text(source, annotate=True)
    lines = migrated.splitlines()
    todo = lines.index("    if torch.cuda.get_device_properties(0).major >= 8:") - 1
    assert lines[todo].startswith("    # TODO(npu-migrate NPU204): `torch.cuda.get_device_properties`: ")
    assert lines[todo].endswith("(see `npu-migrate rules NPU204`)")
    assert migrated.count("TODO(npu-migrate") == 1
    again, _ = migrate_text(migrated, annotate=True)
    assert again == migrated


def test_without_annotate_open_findings_do_not_change_the_file():
    source = "import torch\nprops = torch.cuda.get_device_properties(0)\n"
    migrated, findings = migrate_text(source)
    assert migrated == source and [f.rule_id for f in findings] == ["NPU204"]


# -- configuration ------------------------------------------------------------------------------------------


@pytest.fixture
def configured(tmp_path):
    (tmp_path / "src" / "tests").mkdir(parents=True)
    (tmp_path / "src" / "train.py").write_text(CUDA)
    (tmp_path / "src" / "tests" / "test_train.py").write_text(CUDA)
    (tmp_path / "src" / "vendored.py").write_text(CUDA)
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'demo'\n\n"
        "[tool.npu-migrate]\n"
        "ignore = ['NPU001']\n"
        "exclude = ['src/vendored.py']\n"
        "per-file-ignores = { 'src/tests/*' = ['NPU2'] }\n"
    )
    return tmp_path


def test_configuration_is_found_from_the_paths_upwards_and_applied(configured):
    result = run_cli("apply", "--diff", ".", cwd=configured / "src")  # pyproject.toml is one level up
    assert result.returncode == 0, result.stderr
    assert "import torch_npu" not in result.stdout  # ignore = NPU001
    assert "vendored.py" not in result.stdout  # exclude, relative to the configuration's folder
    test, train = result.stdout.split("--- a/train.py")
    assert test.startswith("--- a/tests/test_train.py")
    assert "+x = torch.ones(2).npu()" in test and "torch.npu.synchronize" not in test  # per-file-ignores
    assert "+torch.npu.synchronize()" in train


def test_command_line_overrides_the_configuration(configured):
    result = run_cli("apply", "--diff", "--ignore", "NPU2", "src", cwd=configured)
    assert "+import torch_npu" in result.stdout  # --ignore replaced the file's ignore list
    assert "torch.npu.synchronize" not in result.stdout


@pytest.mark.parametrize(
    "body, message",
    [
        ("colour = 'red'\n", "unknown key 'colour'"),
        ("select = 3\n", "select: expected a list of strings"),
        ("fused = 'maybe'\n", "fused: expected true, false or a table"),
        ("select = ['NPU99']\n", "unknown rule or prefix 'NPU99'"),
        ("torch-npu-version = '0.1'\n", "unknown torch_npu version '0.1'"),
        ("require-clean-git = 'yes'\n", "require-clean-git: expected true or false"),
        ("fail-on = 'info'\n", "fail-on: expected one of 'rewrite', 'error', 'warning'"),
    ],
)
def test_bad_configuration_is_an_error_naming_the_file_and_key(tmp_path, body, message):
    (tmp_path / "pyproject.toml").write_text("[tool.npu-migrate]\n" + body)
    (tmp_path / "m.py").write_text(CUDA)
    result = run_cli("apply", "--diff", "m.py", cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    if "unknown key" in message or "expected" in message:
        assert "pyproject.toml" in result.stderr


def test_rules_shows_what_the_configuration_enables(configured):
    listing = run_cli("rules", cwd=configured).stdout
    assert "configuration: " in listing
    assert any(line.startswith("NPU001  off") for line in listing.splitlines())
    assert any(line.startswith("NPU101  on") for line in listing.splitlines())


# -- git safety ---------------------------------------------------------------------------------------------


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _commit(tmp_path, *names):
    git("add", *names, cwd=tmp_path)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "add", cwd=tmp_path)


def _tree(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.py"))}


def test_a_dirty_file_that_would_change_refuses_the_whole_in_place_run_before_any_write(tmp_path):
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "a_committed.py").write_text(CUDA)
    (tmp_path / "b_edited.py").write_text("import torch\n")
    (tmp_path / "c_committed.py").write_text(CUDA)
    _commit(tmp_path, "a_committed.py", "b_edited.py", "c_committed.py")
    (tmp_path / "b_edited.py").write_text(CUDA)  # work in progress git could not give back
    before = _tree(tmp_path)

    result = run_cli("apply", ".", cwd=tmp_path)
    assert result.returncode == 2
    assert "nothing written" in result.stderr and "b_edited.py" in result.stderr
    assert "--force" in result.stderr
    assert _tree(tmp_path) == before, "not one file may be written, not even the clean ones before or after it"

    forced = run_cli("apply", "--force", ".", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert all(b".npu()" in data for data in _tree(tmp_path).values())


def test_a_git_that_cannot_say_what_changed_refuses_the_in_place_run(tmp_path):
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "a.py").write_text(CUDA)
    _commit(tmp_path, "a.py")
    (tmp_path / ".git" / "index").write_bytes(b"not an index")  # `git status` fails: unknown is not clean
    result = run_cli("apply", ".", cwd=tmp_path)
    assert result.returncode == 2
    assert "cannot tell which files" in result.stderr and "--force" in result.stderr
    assert (tmp_path / "a.py").read_text() == CUDA


def test_a_renamed_file_is_dirty_under_its_new_name_and_its_old_name_is_not_misread(tmp_path):
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "old_name.py").write_text(CUDA)
    _commit(tmp_path, "old_name.py")
    git("mv", "old_name.py", "new_name.py", cwd=tmp_path)
    result = run_cli("apply", ".", cwd=tmp_path)
    assert result.returncode == 2 and "new_name.py" in result.stderr
    assert (tmp_path / "new_name.py").read_text() == CUDA


def test_untracked_files_and_dirty_files_with_nothing_to_migrate_do_not_refuse_the_run(tmp_path):
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "notes.py").write_text("import torch\n")
    _commit(tmp_path, "notes.py")
    (tmp_path / "notes.py").write_text("import torch\n\nx = torch.ones(2)\n")  # dirty, nothing to migrate
    (tmp_path / "new.py").write_text(CUDA)  # untracked: new work, not uncommitted changes

    result = run_cli("apply", ".", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ".npu()" in (tmp_path / "new.py").read_text()
    assert (tmp_path / "notes.py").read_text() == "import torch\n\nx = torch.ones(2)\n"


def test_require_clean_git_can_be_switched_off(tmp_path):
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "draft.py").write_text("import torch\n")
    _commit(tmp_path, "draft.py")
    (tmp_path / "pyproject.toml").write_text("[tool.npu-migrate]\nrequire-clean-git = false\n")
    (tmp_path / "draft.py").write_text(CUDA)
    assert run_cli("apply", ".", cwd=tmp_path).returncode == 0
    assert ".npu()" in (tmp_path / "draft.py").read_text()
