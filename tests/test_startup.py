"""Start-up (#16): a one-file `apply --check` that no rule may want imports neither the rules nor libcst,
nor pydantic (typer's value conversion) nor the process pool; and the light conversion of parameter
values (`command._LightCoercion`) returns what typer's own would, errors included. The time itself is
measured by benchmarks/bench_startup.py, not here."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.main import get_command

from npu_migrate.cli.app import app
from npu_migrate.cli.command import _LightCoercion

HEAVY = ("libcst", "npu_migrate.engine.registry", "npu_migrate.transforms", "pydantic", "concurrent.futures.process")

PROBE = """
import sys
from npu_migrate.cli.app import main
sys.argv = ["npu-migrate", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    print("exit:", exc.code)
print("heavy:", sorted(m for m in {heavy!r} if m in sys.modules))
"""


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args], cwd=tmp_path, capture_output=True, text=True
    )


def test_a_file_no_rule_may_want_costs_no_heavy_import(tmp_path):
    (tmp_path / "plain.py").write_text("x = 1\n")
    result = _run(tmp_path, "apply", "--check", "plain.py")
    assert "exit: 0" in result.stdout and "heavy: []" in result.stdout, result.stdout + result.stderr
    assert "1 file scanned, 0 would change" in result.stderr


def test_a_file_with_cuda_still_gets_the_rules(tmp_path):
    (tmp_path / "gpu.py").write_text("import torch\nx = torch.ones(1).cuda()\n")
    result = _run(tmp_path, "apply", "--check", "gpu.py")
    assert "exit: 1" in result.stdout, result.stdout + result.stderr
    assert "'libcst'" in result.stdout and "NPU101" in result.stderr


def test_a_selection_is_still_checked_against_the_rules(tmp_path):
    (tmp_path / "plain.py").write_text("x = 1\n")
    result = _run(tmp_path, "apply", "--check", "--select", "NPU999X", "plain.py")
    assert "exit: 2" in result.stdout and "unknown rule or prefix 'NPU999X'" in result.stderr


def _parameters():
    group = get_command(app)
    for name, command in [("npu-migrate", group), *group.commands.items()]:
        context = typer.Context(command)
        for param in command.get_params(context):
            yield pytest.param(context, param, id=f"{name}:{param.name}")


def _outcome(coercion, value, param, context):
    try:
        return "value", coercion.coerce(value, param=param, ctx=context)
    except Exception as exc:  # the errors must be the same too
        return "error", type(exc).__name__, str(exc)


@pytest.mark.parametrize(("context", "param"), list(_parameters()))
def test_the_light_conversion_returns_what_typer_would(context, param):
    typers_own = param.get_runtime_param.args[0]  # what `_LightCoercion` falls back on
    multi = param.multiple or param.nargs == -1
    for value in (None, param.default, ("a.py", "b/c") if multi else "a.py", ("2",) if multi else "0.05"):
        light = _outcome(_LightCoercion(typers_own), value, param, context)
        assert light == _outcome(typers_own(), value, param, context), value


ALARM_PROBE = """
import signal, sys
from npu_migrate.engine import pipeline

def alarm(signum, frame):
    raise SystemExit("the alarm went off during the import")

signal.signal(signal.SIGALRM, alarm)
signal.setitimer(signal.ITIMER_REAL, 0.05)  # less than importing libcst takes anywhere
pipeline._import_engine()
left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
print("left:", left > 0, "libcst:", "libcst" in sys.modules)
"""


def test_the_engine_import_is_not_counted_in_the_first_files_time_limit():
    result = subprocess.run([sys.executable, "-c", ALARM_PROBE], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "left: True libcst: True"


def _freeze_count(script: str) -> int:
    code = f"import gc\nfrom npu_migrate.engine import pipeline, runner\n{script}\nprint(gc.get_freeze_count())\n"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_the_engine_freezes_the_collector_only_in_the_tool_s_own_runs():
    # gc.freeze() keeps what the engine's import made out of the collector's walks (#26); a program using
    # the engine as a library keeps its collector as it was (frozen objects are never freed from cycles).
    assert _freeze_count("pipeline._import_engine()") == 0
    assert _freeze_count("with runner._collector_for_files():\n    pipeline._import_engine()") > 0
