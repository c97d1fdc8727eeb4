"""The hooks in .pre-commit-hooks.yaml, run by the real `pre-commit` (try-repo) on a throwaway git repo.

pre-commit builds a virtualenv and pip-installs this project into it, so the first run takes a while.

`pre-commit try-repo ROOT` would only see *committed and tracked* files (for a dirty checkout it makes
a shadow commit of `git add -u`, which leaves untracked files such as a new .pre-commit-hooks.yaml or
a new module out). So the test snapshots the working tree as it is now (tracked and untracked files,
minus what .gitignore excludes) into a temporary git repository, commits it, and tries that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

# A rewrite (.cuda()) and a finding only a human can act on (NPU305, report-only, severity error), which
# must not keep the check hook failing once the fix hook has run.
CUDA_SOURCE = "import torch\nx = torch.ones(1).cuda()\nm = torch.nn.DataParallel(torch.nn.Linear(1, 1))\n"
SHELL_SOURCE = "export CUDA_VISIBLE_DEVICES=0\npython train.py\n"
_SKIP_WITHOUT_GIT = {".git", ".venv", "__pycache__", "build", "dist", ".pytest_cache", ".hypothesis"}


def _pre_commit() -> list[str]:
    exe = Path(sys.executable).with_name("pre-commit")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pre_commit"]


@pytest.fixture
def env(tmp_path):
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text(
        "[user]\n\tname = npu-migrate tests\n\temail = tests@example.invalid\n"
        "[commit]\n\tgpgsign = false\n[init]\n\tdefaultBranch = main\n"
    )
    return {
        **os.environ,  # keeps PATH (git) and the pip configuration pre-commit's pip install relies on
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "GIT_CONFIG_GLOBAL": str(gitconfig),
        "GIT_CONFIG_NOSYSTEM": "1",
        "NO_COLOR": "1",
    }


def git(*args, cwd, env):
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)


def _working_tree_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return [name for name in out.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (e.g. an unpacked sdist)
        return [
            p.relative_to(ROOT).as_posix()
            for p in ROOT.rglob("*")
            if p.is_file()
            and not (_SKIP_WITHOUT_GIT & set(p.relative_to(ROOT).parts))
            and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
        ]


@pytest.fixture
def hook_repo(tmp_path, env):
    """A committed copy of this checkout's working tree: what `try-repo` installs the hooks from."""
    repo = tmp_path / "npu-migrate-hooks"
    repo.mkdir()
    for name in _working_tree_files():
        source = ROOT / name
        if not source.exists() and not source.is_symlink():  # tracked but deleted in the working tree
            continue
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    assert (repo / ".pre-commit-hooks.yaml").is_file()
    git("init", "-q", cwd=repo, env=env)
    git("add", "-A", cwd=repo, env=env)
    git("commit", "-q", "--no-verify", "-m", "snapshot", cwd=repo, env=env)
    return repo


@pytest.fixture
def project(tmp_path, env):
    project = tmp_path / "project"
    project.mkdir()
    git("init", "-q", cwd=project, env=env)
    (project / "train.py").write_text(CUDA_SOURCE)
    (project / "run.sh").write_text(SHELL_SOURCE)
    (project / "notes.txt").write_text("runs on cuda\n")  # not a kind npu-migrate reads: never passed to it
    git("add", "train.py", "run.sh", "notes.txt", cwd=project, env=env)
    return project


FILES = ("train.py", "run.sh", "notes.txt")


def try_repo(hook_repo, hook_id, *, cwd, env):
    return subprocess.run(
        [*_pre_commit(), "try-repo", str(hook_repo), hook_id, "--color", "never", "--files", *FILES],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_check_hook_fails_with_diff_then_fix_hook_migrates_staged_file(hook_repo, project, env):
    # 1. The check hook: fails, prints the patch, leaves the files alone.
    check = try_repo(hook_repo, "npu-migrate", cwd=project, env=env)
    output = check.stdout + check.stderr
    assert check.returncode == 1, output
    assert "Failed" in output, output
    assert "+x = torch.ones(1).npu()" in output, output
    assert "-x = torch.ones(1).cuda()" in output, output
    assert "+export ASCEND_RT_VISIBLE_DEVICES=0" in output, "shell scripts are checked too"
    assert "notes.txt" not in output, output
    assert (project / "train.py").read_text() == CUDA_SOURCE

    # 2. The fix hook on the *staged* files (which in-place apply refuses without --force):
    #    it rewrites them, so pre-commit reports it as failed ("files were modified").
    fix = try_repo(hook_repo, "npu-migrate-fix", cwd=project, env=env)
    output = fix.stdout + fix.stderr
    assert fix.returncode == 1, output
    assert "files were modified by this hook" in output, output
    migrated = (project / "train.py").read_text()
    assert ".npu()" in migrated and ".cuda()" not in migrated, migrated
    assert "import torch_npu" in migrated, migrated
    assert (project / "run.sh").read_text() == "export ASCEND_RT_VISIBLE_DEVICES=0\npython train.py\n"
    assert (project / "notes.txt").read_text() == "runs on cuda\n"

    # 3. Re-staged, the check hook passes, although the DataParallel finding (for a human) is still there
    #    and still shown: report-only findings do not fail it (README, .pre-commit-hooks.yaml).
    git("add", "train.py", "run.sh", cwd=project, env=env)
    recheck = try_repo(hook_repo, "npu-migrate", cwd=project, env=env)
    output = recheck.stdout + recheck.stderr
    assert recheck.returncode == 0, output
    assert "Passed" in output, output
    assert (project / "train.py").read_text() == migrated


def test_the_hooks_take_exactly_the_files_npu_migrate_reads():
    """`files` in .pre-commit-hooks.yaml is a regex; it must list the same kinds as `npu_migrate.files.kinds`."""
    import re

    import yaml

    from npu_migrate.files.kinds import kind_of

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    patterns = {hook["files"] for hook in hooks}
    assert len(patterns) == 1, "both hooks take the same files"
    files = re.compile(patterns.pop())
    names = [
        "a.py", "nb/a.ipynb", "run.sh", "x.bash", ".env", "conf/.env.local", "prod.env", "a.yaml", "b.yml",
        "k.cu", "k.cuh", "Dockerfile", "docker/Dockerfile.dev", "app.dockerfile",
        "README.md", "a.pyc", "envs/x.txt", "Dockerfile.d/readme.md", "my.environment", "setup.cfg", "a.c",
    ]  # fmt: skip
    for name in names:
        assert bool(files.search(name)) == (kind_of(Path(name)) is not None), name
