"""Confirmed review defects outside the fused rules: each test here failed before its fix."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_cli import run_cli

from npu_migrate.engine.cache import FOLDER

CUDA = "import torch\n\nx = torch.ones(2).cuda()\n"


def test_npu803_reads_an_except_type_with_no_dotted_name_without_losing_the_file(tmp_path):
    # `(ImportError,) + EXTRA` has no full name: the requirement rule crashed on it (None.rsplit), and
    # the file's other rewrites were lost with it.
    source = (
        "import torch\nEXTRA = (OSError,)\ntry:\n    import apex\nexcept (ImportError,) + EXTRA:\n"
        '    raise RuntimeError("need apex")\nx = torch.zeros(3).cuda()\n'
    )
    (tmp_path / "a.py").write_text(source)
    done = run_cli("apply", "--diff", "--no-cache", "a.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "+x = torch.zeros(3).npu()" in done.stdout
    assert "failed" not in done.stdout.replace("0 failed", "")


def _two_places(tmp_path):
    """A module of a package (`pkg/mod.py`) and a script (`solo/solo.py`), and a third folder to run from."""
    package = tmp_path / "repo" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(CUDA)
    (tmp_path / "solo").mkdir()
    (tmp_path / "solo" / "solo.py").write_text(CUDA)
    (tmp_path / "elsewhere").mkdir()
    return package / "mod.py", tmp_path / "solo" / "solo.py"


@pytest.mark.parametrize("cache", [["--no-cache"], []])
def test_npu001_says_part_of_a_package_by_the_files_place_not_the_current_folder(tmp_path, cache):
    module, script = _two_places(tmp_path)
    # Run from inside the package (the display name `solo.py` resolved there named `pkg/solo.py`...) and from
    # a folder holding neither, twice each: the cache must not serve one place's message for the other's.
    for cwd in (module.parent, tmp_path / "elsewhere", module.parent, tmp_path / "elsewhere"):
        solo = run_cli("apply", "--diff", "--show-fixes", *cache, script, cwd=cwd)
        assert "part of a package" not in solo.stderr, (cwd, solo.stderr)
        # ...and a package's module run from elsewhere was told nothing.
        mod = run_cli("apply", "--diff", "--show-fixes", *cache, module, cwd=cwd)
        assert "part of a package" in mod.stderr, (cwd, mod.stderr)


def test_npu001_on_stdin_reads_the_place_from_stdin_filename(tmp_path, monkeypatch):
    # `apply -` prints no fixed finding, so what is checked is the message the rule made.
    from typer.testing import CliRunner

    from npu_migrate.cli.app import app
    from npu_migrate.engine import pipeline

    seen: list[str] = []
    real = pipeline.migrate_file

    def recording(*args, **kw):
        new_text, findings, parsed = real(*args, **kw)
        seen.extend(f.message for f in findings if f.rule_id == "NPU001")
        return new_text, findings, parsed

    monkeypatch.setattr(pipeline, "migrate_file", recording)
    module, script = _two_places(tmp_path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    for name, told in ((module, True), (script, False), ("-", False)):
        seen.clear()
        args = ["apply", "--diff", *(["--stdin-filename", str(name)] if name != "-" else []), "-"]
        done = CliRunner().invoke(app, args, input=CUDA)
        assert done.exit_code == 0, done.output
        assert len(seen) == 1 and ("part of a package" in seen[0]) is told, (name, seen)


def _sdpa_project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.npu-migrate]\nfused = { fused-sdpa = true }\n")
    (tmp_path / "f.py").write_text((ROOT / "fixtures" / "rules" / "NPU707" / "sdpa_functional.in.py").read_text())


@pytest.mark.parametrize(("select", "runs"), [("NPU1", False), ("NPU7", True), ("NPU707", True), ("ALL", True)])
def test_apply_adds_a_fused_opt_in_only_where_the_selection_takes_in_its_family(tmp_path, select, runs):
    _sdpa_project(tmp_path)
    done = run_cli("apply", "--diff", "--no-cache", "--select", select, "f.py", cwd=tmp_path)
    assert ("NPU707" in done.stderr) is runs, done.stderr


@pytest.mark.parametrize(("select", "runs"), [("NPU1", False), ("NPU7", True), (None, True)])
def test_analyze_adds_a_fused_opt_in_only_where_the_selection_takes_in_its_family(tmp_path, monkeypatch, select, runs):
    from typer.testing import CliRunner

    from npu_migrate.analyze import project
    from npu_migrate.cli.app import app

    _sdpa_project(tmp_path)
    chosen = []
    real = project.Settings

    def recording(**kw):
        chosen.append(kw["enabled"])
        return real(**kw)

    monkeypatch.setattr(project, "Settings", recording)
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["analyze", *(["--select", select] if select else []), "f.py"])
    assert done.exit_code == 0, done.output
    assert ("NPU707" in chosen[0]) is runs


CONFIGS = {
    "nope.toml": None,  # missing
    "folder": None,  # a directory
    "bad.toml": "[tool.npu-migrate\n",
    "other.toml": "[tool.other]\nx = 1\n",
    "tool.toml": "tool = 3\n",
}


def _one_line_error(done, *names):
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npu-migrate: error: "), done.stderr
    assert all(name in lines[0] for name in names), lines[0]


@pytest.mark.parametrize("command", [["apply", "--diff"], ["analyze"], ["rules"]])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_config_that_cannot_be_read_is_a_one_line_error(tmp_path, command, name):
    (tmp_path / "a.py").write_text(CUDA)
    (tmp_path / "folder").mkdir()
    if CONFIGS[name] is not None:
        (tmp_path / name).write_text(CONFIGS[name])
    files = [] if command == ["rules"] else ["a.py"]
    _one_line_error(run_cli(*command, "--config", name, *files, cwd=tmp_path), name)


def test_an_output_folder_that_cannot_be_made_is_a_one_line_error(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text(CUDA)
    (tmp_path / "src" / "README.txt").write_text("copied as it is\n")
    (tmp_path / "afile").write_text("")
    for output in ("/proc/npu-migrate-out", "afile/out"):
        for given in ("src/a.py", "src"):
            _one_line_error(run_cli("apply", "--output", output, given, cwd=tmp_path), output)


def test_a_change_list_that_cannot_be_written_is_a_one_line_error(tmp_path):
    (tmp_path / "a.py").write_text(CUDA)
    (tmp_path / "out" / "change_list.csv").mkdir(parents=True)  # a folder where the file goes
    _one_line_error(run_cli("apply", "--output", "out", "a.py", cwd=tmp_path), "change_list.csv")


def test_the_tool_fingerprint_changes_with_jinja2s_version(tmp_path, monkeypatch):
    # jinja2 renders the injected helpers: another version may render them differently.
    import importlib.util

    from npu_migrate.engine import cache

    real = importlib.util.find_spec
    fingerprints = []
    for version in ("3.1.6", "9.9.9"):
        fake = tmp_path / version / "jinja2"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text(f'__version__ = "{version}"\n')
        spec = importlib.util.spec_from_file_location("jinja2", fake / "__init__.py", submodule_search_locations=[])
        spec.submodule_search_locations.append(str(fake))
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a, _s=spec: _s if name == "jinja2" else real(name, *a)
        )
        monkeypatch.setattr(cache, "_TOOL_FINGERPRINT", None)
        fingerprints.append(cache.tool_fingerprint())
    assert fingerprints[0] != fingerprints[1]


def test_the_cache_root_is_decided_by_the_inputs_not_the_working_folder(tmp_path):
    from npu_migrate.engine.cache import cache_root

    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "src" / "pkg" / "a.py").write_text(CUDA)
    sub = repo / "tools"  # a project of its own inside the repository
    sub.mkdir()
    (sub / "pyproject.toml").write_text("[project]\nname = 't'\n")
    (sub / "t.py").write_text(CUDA)
    assert cache_root([repo / "src" / "pkg" / "a.py"]) == repo  # the nearest .git above
    assert cache_root([repo / "src", sub / "t.py"]) == repo  # the common folder's
    assert cache_root([sub / "t.py"]) == sub  # the nearest pyproject.toml
    assert cache_root([sub / "t.py"], repo / "pyproject.toml") == repo  # the configuration's, covering it
    assert cache_root([sub / "t.py"], tmp_path / "other" / "pyproject.toml") == sub  # not covering it


@pytest.mark.parametrize("command", [["apply", "--diff"], ["analyze"]])
def test_a_run_from_a_repository_on_a_file_elsewhere_leaves_no_cache_in_the_repository(tmp_path, command):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[tool.npu-migrate]\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # its project's root
    (elsewhere / "x.py").write_text(CUDA)
    done = run_cli(*command, elsewhere / "x.py", cwd=repo)
    assert done.returncode in (0, 1), done.stderr
    assert not (repo / FOLDER).exists()
    assert (elsewhere / FOLDER).is_dir()
