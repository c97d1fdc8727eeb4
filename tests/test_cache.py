"""The per-file result cache (#26): an unchanged file is answered from `.npu_migrate_cache/`, and anything
its result depends on (content, tool, configuration, options, target) makes it computed again. A torn or
forged entry is never trusted, two runs at once agree with a run without the cache, `--no-cache` and
`cache = false` bypass it, and an in-place write is never taken from it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_cli import run_cli

from npu_migrate.engine import cache as cache_module
from npu_migrate.engine import pipeline, runner
from npu_migrate.engine.cache import FOLDER, Cache
from npu_migrate.engine.pipeline import Job, Mode, Plan, Status
from npu_migrate.engine.registry import select_rules

CUDA = "import torch\n\nx = torch.ones(2).cuda()\ntorch.cuda.synchronize()\n"
PLAIN = "y = 1\n"


@pytest.fixture
def counted(monkeypatch):
    """The files `process` really migrates (the cache's misses), in this process (`workers=1`)."""
    calls: list[str] = []
    real = pipeline.process

    def counting(job, plan, seen=None):
        calls.append(job.display)
        return real(job, plan, seen)

    monkeypatch.setattr(runner, "process", counting)
    return calls


def _plan(mode=Mode.DIFF, **kw) -> Plan:
    return Plan(kw.pop("enabled", select_rules()), kw.pop("version", None), mode, **kw)


def _tree(tmp_path: Path) -> list[Job]:
    (tmp_path / "train.py").write_text(CUDA)
    (tmp_path / "plain.py").write_text(PLAIN)
    return [Job(tmp_path / name, name) for name in ("plain.py", "train.py")]


def _run(jobs, plan, root):
    return list(runner.run(jobs, plan, 1, Cache.open(root, plan)))


def _uncached(jobs, plan):
    return list(runner.run(jobs, plan, 1))


def test_a_second_run_is_answered_from_the_cache_with_the_same_results(tmp_path, counted):
    jobs = _tree(tmp_path)
    first = _run(jobs, _plan(), tmp_path)
    assert counted == ["plain.py", "train.py"]
    second = _run(jobs, _plan(), tmp_path)
    assert counted == ["plain.py", "train.py"]  # nothing migrated again
    assert second == first == _uncached(jobs, _plan())
    assert second[1].status is Status.CHANGED and "torch.ones(2).npu()" in second[1].diff
    assert (tmp_path / FOLDER / ".gitignore").read_text().splitlines()[-1] == "*"


def _key_changes(tmp_path, counted, change) -> None:
    """Run, apply `change` (returning the jobs and plan of the second run), run again: the second run must
    migrate train.py again and give what a run without the cache gives."""
    jobs = _tree(tmp_path)
    _run(jobs, _plan(), tmp_path)
    counted.clear()
    jobs, plan = change(jobs)
    results = _run(jobs, plan, tmp_path)
    migrated = list(counted)
    assert "train.py" in migrated
    assert results == _uncached(jobs, plan)
    counted[:] = migrated


def test_the_files_content_is_in_the_key(tmp_path, counted):
    def edit(jobs):
        (tmp_path / "train.py").write_text(CUDA.replace("ones(2)", "zeros(3)"))
        return jobs, _plan()

    _key_changes(tmp_path, counted, edit)
    assert counted == ["train.py"]  # plain.py did not change


def test_the_tools_own_code_is_in_the_key(tmp_path, counted, monkeypatch):
    def new_version(jobs):
        monkeypatch.setattr(cache_module, "_TOOL_FINGERPRINT", "0" * 24)
        return jobs, _plan()

    _key_changes(tmp_path, counted, new_version)


def test_the_tool_fingerprint_hashes_the_package_files(monkeypatch, tmp_path):
    monkeypatch.setattr(cache_module, "_TOOL_FINGERPRINT", None)
    first = cache_module.tool_fingerprint()
    assert cache_module.tool_fingerprint() == first  # once per process
    # Any rule's, table's or template's content is in it: a fake package root with one file edited.
    fake = tmp_path / "pkg"
    fake.mkdir()
    (fake / "rule.py").write_text("A = 1\n")
    import importlib.util

    real_find = importlib.util.find_spec

    def find(name, *args):
        spec = real_find(name, *args)
        if name == "npu_migrate.transforms":
            spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
            spec.submodule_search_locations = [str(fake)]
        return spec

    monkeypatch.setattr(importlib.util, "find_spec", find)
    fingerprints = []
    for content in ("A = 1\n", "A = 2\n"):
        (fake / "rule.py").write_text(content)
        monkeypatch.setattr(cache_module, "_TOOL_FINGERPRINT", None)
        fingerprints.append(cache_module.tool_fingerprint())
    assert fingerprints[0] != fingerprints[1] and first not in fingerprints


@pytest.mark.parametrize(
    "plan_change",
    [
        {"enabled": select_rules(["NPU1"])},  # configuration: select / ignore / fused
        {"version": "2.1.0"},  # the torch_npu version
        {"annotate": True},  # an option
        {"target": "portable"},  # the target
    ],
    ids=["rules", "torch-npu-version", "annotate", "target"],
)
def test_the_settings_that_reach_a_file_are_in_the_key(tmp_path, counted, plan_change):
    _key_changes(tmp_path, counted, lambda jobs: (jobs, _plan(**plan_change)))


def test_per_file_ignores_and_the_helper_module_are_in_the_key(tmp_path, counted):
    _key_changes(tmp_path, counted, lambda jobs: ([replace(j, ignore=("NPU101",)) for j in jobs], _plan()))
    counted.clear()
    _key_changes(tmp_path, counted, lambda jobs: ([replace(j, helper_module="pkg._npu_fused") for j in jobs], _plan()))


def _entries(root: Path) -> list[Path]:
    return sorted((root / FOLDER).glob("*/*/*.json"))


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # torn by a crash
        lambda data: b"",
        lambda data: data.replace(b'"status"', b'"statuz"'),  # body edited: the checksum no longer matches
        lambda data: b"\xff\xfe garbage",
    ],
    ids=["torn", "empty", "edited", "garbage"],
)
def test_a_damaged_entry_is_ignored(tmp_path, counted, damage):
    jobs = _tree(tmp_path)
    expected = _run(jobs, _plan(), tmp_path)
    for entry in _entries(tmp_path):
        entry.write_bytes(damage(entry.read_bytes()))
    counted.clear()
    assert _run(jobs, _plan(), tmp_path) == expected
    assert counted == ["plain.py", "train.py"]
    assert _run(jobs, _plan(), tmp_path) == expected  # and rewritten whole


def test_an_entry_with_a_valid_checksum_but_a_wrong_shape_is_ignored(tmp_path, counted):
    jobs = _tree(tmp_path)
    expected = _run(jobs, _plan(), tmp_path)
    import hashlib

    for entry in _entries(tmp_path):
        body = json.dumps({"status": "changed"}).encode()
        entry.write_bytes(b"npu-migrate-cache " + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    counted.clear()
    assert _run(jobs, _plan(), tmp_path) == expected and len(counted) == 2


def test_in_place_never_takes_a_write_from_the_cache(tmp_path, counted):
    jobs = _tree(tmp_path)
    _run(jobs, _plan(), tmp_path)  # a --diff run stores train.py as "would change"
    counted.clear()
    results = _run(jobs, _plan(Mode.IN_PLACE), tmp_path)
    assert counted == ["train.py"]  # plain.py ("no change") came from the cache; train.py was migrated
    assert results[1].status is Status.CHANGED
    assert "torch.ones(2).npu()" in (tmp_path / "train.py").read_text()
    assert (tmp_path / "plain.py").read_text() == PLAIN


def test_a_failure_is_not_stored(tmp_path, counted):
    (tmp_path / "bad.py").write_text("def f(:\n    x.cuda()\n")
    jobs = [Job(tmp_path / "bad.py", "bad.py")]
    for _ in range(2):
        assert _run(jobs, _plan(), tmp_path)[0].status is Status.FAILED
    assert counted == ["bad.py", "bad.py"] and not _entries(tmp_path)


def test_an_unwritable_project_runs_without_a_cache(tmp_path):
    (tmp_path / FOLDER).write_text("not a folder")
    assert Cache.open(tmp_path, _plan()) is None


# --- the command line --------------------------------------------------------------------------------


def _forge(root: Path, display: str, diff: str) -> None:
    """Rewrite the entry of `display` with a valid checksum and a diff no migration would give: a run
    that prints it read the cache."""
    import hashlib

    for entry in _entries(root):
        header, _, body = entry.read_bytes().partition(b"\n")
        doc = json.loads(body)
        if doc["display"] == display:
            doc["diff"] = diff
            body = json.dumps(doc).encode()
            entry.write_bytes(b"npu-migrate-cache " + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
            return
    raise AssertionError(f"no entry for {display}")


def test_the_command_line_reads_the_cache_and_no_cache_bypasses_it(tmp_path):
    (tmp_path / "train.py").write_text(CUDA)
    cold = run_cli("apply", "--diff", ".", cwd=tmp_path)
    assert cold.returncode == 0 and "npu()" in cold.stdout
    _forge(tmp_path, "train.py", "FROM THE CACHE\n")
    assert run_cli("apply", "--diff", ".", cwd=tmp_path).stdout == "FROM THE CACHE\n"
    bypassed = run_cli("apply", "--diff", "--no-cache", ".", cwd=tmp_path)
    assert (bypassed.stdout, bypassed.stderr) == (cold.stdout, cold.stderr)


def test_no_cache_and_the_config_key_write_nothing(tmp_path):
    (tmp_path / "train.py").write_text(CUDA)
    assert run_cli("apply", "--check", "--no-cache", ".", cwd=tmp_path).returncode == 1
    assert not (tmp_path / FOLDER).exists()
    (tmp_path / "pyproject.toml").write_text("[tool.npu-migrate]\ncache = false\n")
    assert run_cli("apply", "--check", ".", cwd=tmp_path).returncode == 1
    assert not (tmp_path / FOLDER).exists()
    (tmp_path / "pyproject.toml").write_text('[tool.npu-migrate]\ncache = "no"\n')
    result = run_cli("apply", "--check", ".", cwd=tmp_path)
    assert result.returncode == 2 and "cache: expected true or false" in result.stderr


def test_two_runs_at_once_agree_with_a_run_without_the_cache(tmp_path):
    for i in range(40):  # enough files for a worker pool in each run
        (tmp_path / f"m{i:02}.py").write_text(CUDA.replace("ones(2)", f"ones({i})") if i % 3 else PLAIN)
    expected = run_cli("apply", "--diff", "--no-cache", ".", cwd=tmp_path)
    for _ in range(2):  # both cold (racing to write the same entries), then both warm
        command = [sys.executable, "-m", "npu_migrate", "apply", "--diff", "--jobs", "2", "."]
        both = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
        both.append(subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for process in both:
            out, err = process.communicate(timeout=120)
            assert (out, err) == (expected.stdout, expected.stderr)
    assert len(_entries(tmp_path)) == 40
    assert not list((tmp_path / FOLDER).glob("**/.tmp-*"))  # no temporary file left behind


def test_analyze_shares_the_entries_of_apply_and_no_cache_bypasses_them(tmp_path):
    (tmp_path / "train.py").write_text(CUDA)
    cold = run_cli("analyze", "--format", "json", ".", cwd=tmp_path)
    assert cold.returncode == 0, cold.stderr
    assert "NPU101" in cold.stdout
    run_cli("apply", "--diff", ".", cwd=tmp_path)
    assert len(_entries(tmp_path)) == 1  # one entry for both commands
    import hashlib

    (entry,) = _entries(tmp_path)
    doc = json.loads(entry.read_bytes().partition(b"\n")[2])
    for finding in doc["findings"]:
        finding[4] = "FROM THE CACHE"
    body = json.dumps(doc).encode()
    entry.write_bytes(b"npu-migrate-cache " + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    assert "FROM THE CACHE" in run_cli("analyze", "--format", "json", ".", cwd=tmp_path).stdout
    bypassed = run_cli("analyze", "--format", "json", "--no-cache", ".", cwd=tmp_path)
    assert bypassed.stdout == cold.stdout and "FROM THE CACHE" not in bypassed.stdout


def test_discovery_does_not_walk_the_cache_folder(tmp_path):
    from npu_migrate.files.discovery import discover

    jobs = _tree(tmp_path)
    _run(jobs, _plan(), tmp_path)
    (tmp_path / FOLDER / "stray.py").write_text(CUDA)  # even a file that looks like input
    found = discover([tmp_path], lambda p: p.suffix == ".py", respect_gitignore=False)
    assert sorted(p.name for p in found.files) == ["plain.py", "train.py"]


FUSED_PACKAGE = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "fused_package"


def test_the_package_and_its_helper_module_are_followed(tmp_path):
    """Where a file imports its fused helpers from depends on the package around it (its `__init__.py`
    files) and what `_npu_fused.py` holds decides what the run appends to it: after each change, a run
    from the cache prints what a run without it prints."""
    import shutil

    shutil.copytree(FUSED_PACKAGE, tmp_path / "p")
    root = tmp_path / "p"

    def both() -> tuple[tuple[str, str], tuple[str, str]]:
        warm = run_cli("apply", "--diff", ".", cwd=root)
        cold = run_cli("apply", "--diff", "--no-cache", ".", cwd=root)
        return (warm.stdout, warm.stderr), (cold.stdout, cold.stderr)

    first = run_cli("apply", "--diff", ".", cwd=root)
    assert "_npu_fused.py" in first.stdout, first.stderr
    warm, cold = both()
    assert warm == cold == (first.stdout, first.stderr)
    # One npu-migrate wrote (a user's own is never appended to) and that holds `_is_npu` already.
    header = '"""Fused torch_npu helpers of this package\'s files: generated by npu-migrate."""\n\nimport torch\n\n\n'
    (root / "fusedpkg" / "_npu_fused.py").write_text(header + "def _is_npu(x):\n    return False\n")
    warm, cold = both()
    assert warm == cold and warm[0] != first.stdout
    (root / "fusedpkg" / "_npu_fused.py").unlink()
    (root / "fusedpkg" / "__init__.py").unlink()  # fusedpkg is no package any more: its helpers go elsewhere
    before = warm
    warm, cold = both()
    assert warm == cold and warm[0] != before[0]
    assert "+from ._npu_fused import _is_npu, _npu_rms_norm" not in warm[0]  # norms.py's, in fusedpkg
