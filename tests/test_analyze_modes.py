"""analyze's modes as one registry: everything that lists the modes is derived from it, each mode's result is
computed once per run and read by the modes that declare it, and the shared types import no mode."""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_analyze import PROJECT, run_analyze

from npu_migrate.analyze import MODES, REGISTRY, core, modes
from npu_migrate.analyze.cli import MODE_CHOICES
from npu_migrate.analyze.project import Mode, ModeResult, Project, Settings
from npu_migrate.engine.registry import select_rules


def test_each_mode_module_is_named_as_its_mode_and_registered():
    modules = sorted(m.name for m in pkgutil.iter_modules(modes.__path__))
    assert modules == sorted(MODES)
    for name, mode in REGISTRY.items():
        assert mode is importlib.import_module(f"npu_migrate.analyze.modes.{name}").MODE
        assert mode.name == name and mode.title
        assert set(mode.reads) <= set(MODES) - {name}


def test_the_command_line_offers_the_registered_modes_and_all():
    assert list(MODE_CHOICES) == [*MODES, "all"]


def test_a_mode_comes_after_the_modes_it_reads_and_only_those_are_added():
    order = [m.name for m in core.in_dependency_order(["model"])]
    assert order[-1] == "model" and set(order[:-1]) == set(REGISTRY["model"].reads)
    assert [m.name for m in core.in_dependency_order(MODES)] == list(MODES)  # the registry order already fits
    assert [m.name for m in core.in_dependency_order(["dynamic_shape"])] == ["dynamic_shape"]


def _mode(name: str, reads: tuple[str, ...] = ()) -> Mode:
    return Mode(
        name, name.title(), scan=lambda source, context: None, collect=lambda project, result: None, reads=reads
    )


def test_modes_that_read_each_other_in_a_circle_are_refused(monkeypatch):
    monkeypatch.setattr(core, "REGISTRY", {"a": _mode("a", ("b",)), "b": _mode("b", ("a",))})
    with pytest.raises(ValueError, match="in a circle: a -> b -> a"):
        core.in_dependency_order(["a"])


def test_reading_a_result_not_declared_fails_loudly():
    project = Project(Path("."), Settings(modes=(), enabled=frozenset()), None, [], [])
    project.results["torch_apis"] = ModeResult("torch_apis", "Torch APIs")
    assert project.result("torch_apis").mode == "torch_apis"
    with pytest.raises(LookupError, match="declare it in `reads`"):
        project.result("model")


def _counting(monkeypatch) -> dict[str, int]:
    """Count each mode's collect calls, running in this process (one worker: no pool to fork)."""
    calls = dict.fromkeys(MODES, 0)

    def counted(mode: Mode) -> Mode:
        def collect(project, result):
            calls[mode.name] += 1
            mode.collect(project, result)

        return dataclasses.replace(mode, collect=collect)

    monkeypatch.setattr(core, "REGISTRY", {name: counted(mode) for name, mode in REGISTRY.items()})
    return calls


def _analyse(*names: str):
    return core.analyse([PROJECT], Settings(modes=names, enabled=select_rules(), jobs=1))


def test_every_result_is_computed_once_however_many_modes_read_it(monkeypatch):
    calls = _counting(monkeypatch)
    analysis = _analyse(*MODES)
    assert [r.mode for r in analysis.results] == list(MODES)
    assert calls == dict.fromkeys(MODES, 1)


def test_a_mode_asked_alone_gets_what_it_reads_computed_but_not_reported(monkeypatch):
    calls = _counting(monkeypatch)
    analysis = _analyse("model")
    assert [r.mode for r in analysis.results] == ["model"]
    assert {name for name, n in calls.items() if n} == {"model", *REGISTRY["model"].reads}
    assert set(calls.values()) <= {0, 1}


@pytest.fixture(scope="module")
def all_modes() -> dict:
    result = run_analyze(PROJECT, "--mode", "all", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["results"]


@pytest.mark.parametrize("name", MODES)
def test_a_mode_alone_reports_what_it_reports_among_all(all_modes, name):
    result = run_analyze(PROJECT, "--mode", name, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["results"] == {name: all_modes[name]}


def _imported_alone(module: str) -> list[str]:
    code = (
        f"import json, sys, {module}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('npu_migrate.analyze') or m == 'libcst')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "module",
    [
        *(f"npu_migrate.analyze.{m}" for m in ("cli", "core", "output", "project", "rules")),
        *(f"npu_migrate.analyze.modes.{m}" for m in MODES),
    ],
)
def test_every_analyze_module_imports_alone(module):
    assert module in _imported_alone(module)


def test_the_shared_types_import_no_mode_and_not_the_run():
    loaded = _imported_alone("npu_migrate.analyze.project")
    assert loaded == ["npu_migrate.analyze", "npu_migrate.analyze.project"]
