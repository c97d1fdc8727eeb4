"""`npu-migrate verify --smoke` on our own fixture projects, migrated by `npu-migrate apply --output` here.

* `fixtures/projects/smoke_runs`: a tiny LM trained by a script (arguments, AMP, one-process DDP over
  nccl, a checkpoint saved and loaded with map_location), launched one DDP process per GPU with
  `torch.multiprocessing.spawn`, importable as a module and built by a factory. Migrated, it must run on the simulated host, on the NPU, through its fused branches.
* `fixtures/projects/smoke_guard`: `HAS_GPU = torch.cuda.is_available()` guards a capability test (issue #13,
  pattern 1). Migrated, both are rewritten and the program runs; the tree an older npu-migrate wrote
  (the guard rewritten, the capability test not) crashes at import, which is what the blame tests use.

Each run starts a fresh interpreter (a few seconds, mostly `import torch`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from npu_migrate.verify import smoke
from npu_migrate.verify.cli import verify_command

pytestmark = pytest.mark.integration  # needs torch (and transformers): the `integration` extra

PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"


def _apply(project: Path, out: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", str(project), "--output", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("runs")
    original, migrated = base / "original", base / "migrated"
    shutil.copytree(PROJECTS / "smoke_runs", original)
    _apply(original, migrated)
    return original, migrated


@pytest.fixture(scope="module")
def guard(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("guard")
    original, migrated = base / "original", base / "migrated"
    shutil.copytree(PROJECTS / "smoke_guard", original)
    _apply(original, migrated)
    return original, migrated


@pytest.fixture(scope="module")
def guard_before(guard, tmp_path_factory) -> Path:
    """smoke_guard as npu-migrate migrated it before issue #13: the guard flipped, the code it guards not."""
    original, _ = guard
    tree = tmp_path_factory.mktemp("guard_before") / "migrated"
    shutil.copytree(original, tree)
    hw = tree / "app" / "hw.py"
    text = hw.read_text().replace("import torch\n", "import torch\nimport torch_npu\n", 1)
    hw.write_text(text.replace("torch.cuda.is_available()", "torch.npu.is_available()"))
    return tree


def _cli(*args: str):
    app = typer.Typer()
    app.command("verify")(verify_command)
    app.command("other")(lambda: None)  # two commands, so `verify` is a subcommand as in npu-migrate
    return CliRunner().invoke(app, ["verify", *args])


# -- a migrated program that runs ----------------------------------------------------------------------


def test_script_with_arguments_trains_on_the_npu(runs):
    original, migrated = runs
    report = smoke.run(migrated, script=migrated / "train.py", args=["--steps", "2", "--ddp"], original=original)
    assert report.passed and report.exit_code == 0, report.to_text(verbose=True)
    assert report.steps == ["script"]
    # The program saw an NPU host: its device is npu, its fused branches ran, its arguments arrived.
    assert "step 2 loss" in report.output_tail and "on npu" in report.output_tail
    assert "done" in report.output_tail
    assert report.fused_calls["npu_rms_norm"] > 0 and report.fused_calls["npu_swiglu"] > 0


@pytest.mark.slow
def test_spawned_ddp_processes_are_npu_hosts_too(runs):
    # launch.py spawns one process per device (torch.npu.device_count() after migration): two fresh
    # interpreters that must find torch_npu, set their device and all-reduce over hccl.
    _, migrated = runs
    report = smoke.run(migrated, script=migrated / "launch.py", device_count=2)
    assert report.passed, report.to_text(verbose=True)
    assert "rank 0/2" in report.output_tail and "rank 1/2" in report.output_tail
    sums = {line.split("summed ")[1] for line in report.output_tail.splitlines() if "summed" in line}
    assert len(sums) == 1  # both ranks hold the same all-reduced value


def test_module_entry(runs):
    _, migrated = runs
    report = smoke.run(migrated, module="tinylm.model")
    assert report.passed, report.to_text(verbose=True)
    assert report.steps == ["import"]


def test_factory_entry_runs_forward_backward_and_a_step(runs):
    original, migrated = runs
    report = smoke.run(migrated, factory=migrated / "factory.py", original=original)
    assert report.passed, report.to_text(verbose=True)
    assert report.steps == ["import", "build", "forward", "backward", "optimizer step"]
    # Two blocks and a final norm: three RMSNorms and two SwiGLUs, once each in one forward pass.
    assert report.fused_calls == {"npu_rms_norm": 3, "npu_swiglu": 2}


def test_without_the_simulated_host_the_migrated_module_cannot_run(runs, tmp_path):
    # The same module on a plain CPU host: torch_npu and torch.npu do not exist there.
    _, migrated = runs
    out = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, "-m", "npu_migrate.verify.smoke_worker", "--root", str(migrated), "--kind", "module"]
        + ["--entry", "tinylm.model", "--host", "cpu", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    error = json.loads(out.read_text())["error"]
    assert error["type"] == "ModuleNotFoundError" and "torch_npu" in error["message"]


def test_a_failure_the_original_has_too_is_exit_2(runs):
    # train.py requires --steps: argparse exits with status 2 in the original on a CPU host as well.
    original, migrated = runs
    report = smoke.run(migrated, script=migrated / "train.py", original=original)
    assert report.crash is not None and report.crash.type == "SystemExit"
    assert report.same_failure_in_original and report.exit_code == 2
    assert "not caused by the migration" in report.to_text()


# -- a flipped guard -----------------------------------------------------------------------------------


def test_flipped_guard_now_runs_with_its_capability_gate(guard):
    original, migrated = guard
    hw = (migrated / "app" / "hw.py").read_text()
    assert "FP16_OK = HAS_GPU and (torch.npu.get_device_capability(0) or (8, 0))[0] >= 7" in hw
    report = smoke.run(migrated, script=migrated / "train.py", args=["--steps", "2"], original=original)
    assert report.passed, report.to_text(verbose=True)
    assert "gpu=True fp16=True" in report.output_tail  # the NPU takes the fp16 path an Ampere GPU takes


def test_flipped_guard_crash_names_file_line_and_rules(guard, guard_before):
    original, _ = guard
    migrated = guard_before
    result = _cli(
        "--smoke", "--migrated", str(migrated), "--script", str(migrated / "train.py"), "--original", str(original)
    )
    assert result.exit_code == 1, result.output
    assert "CRASH at app/hw.py:5: AssertionError: Torch not compiled with CUDA enabled" in result.output
    assert "FP16_OK = HAS_GPU and torch.cuda.get_device_capability(0)[0] >= 7" in result.output
    # The blame is what npu-migrate does today at those lines of the original.
    assert "NPU206 at line 4, rewritten" in result.output
    assert "reads `HAS_GPU`, set at line 3 (NPU201, rewritten)" in result.output


def test_flipped_guard_json_and_module_entry(guard, guard_before):
    original, _ = guard
    migrated = guard_before
    result = _cli(
        "--smoke", "--migrated", str(migrated), "--module", "app.model", "--original", str(original), "--format", "json"
    )
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    crash = data["crash"]
    assert (crash["file"], crash["line"], crash["kind"]) == ("app/hw.py", 5, "crash")
    assert crash["attribution"]["original_line"] == 4
    assert crash["attribution"]["rule_ids"] == ["NPU201", "NPU206"]
    assert data["exit_code"] == 1 and data["passed"] is False


def test_the_original_runs_on_the_simulated_host(guard):
    # Unmigrated, the guard asks CUDA, which an NPU host does not have: the crash is the rewrite's doing.
    original, _ = guard
    report = smoke.run(original, script=original / "train.py", args=["--steps", "2"])
    assert report.passed, report.to_text(verbose=True)
    assert "gpu=False fp16=False" in report.output_tail


def _capability_rewritten(migrated: Path, tmp_path: Path) -> Path:
    """The old migrated tree with the capability call moved to torch.npu, as a hasty reviewer would."""
    tree = tmp_path / "hasty"
    shutil.copytree(migrated, tree)
    hw = tree / "app" / "hw.py"
    hw.write_text(hw.read_text().replace("torch.cuda.get_device_capability", "torch.npu.get_device_capability"))
    return tree


def test_capability_none_is_what_crashes(guard_before, tmp_path, monkeypatch):
    tree = _capability_rewritten(guard_before, tmp_path)
    monkeypatch.delenv("TORCH_NPU_DEVICE_CAPABILITY", raising=False)
    report = smoke.run(tree, module="app.model")
    assert report.crash is not None and report.crash.type == "TypeError", report.to_text()
    assert report.crash.location() == "app/hw.py:5"
    # With the variable torch_npu >= 2.13 reads, the capability is (8, 0) and the program runs...
    monkeypatch.setenv("TORCH_NPU_DEVICE_CAPABILITY", "8.0")
    assert smoke.run(tree, module="app.model").passed
    # ... but not on an older torch_npu, which always returns None.
    assert smoke.run(tree, module="app.model", torch_npu_version="2.8.0.post5").crash.type == "TypeError"


# -- what the host cannot vouch for, and rewrites to APIs a version lacks ---------------------------------

CASES = textwrap.dedent(
    """
    import sys

    import torch
    import torch_npu

    case = sys.argv[1]
    if case == "fused_rejects":
        torch_npu.npu_swiglu(torch.randn(2, 5, device="npu"))
    elif case == "graph":
        graph = torch.npu.NPUGraph()
    """
)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("cases")
    (tree / "cases.py").write_text(CASES)
    return tree


@pytest.mark.parametrize(
    ("case", "version", "kind", "error"),
    [
        ("fused_rejects", None, "npu_op", "NpuOpError"),
        ("graph", "2.14.0", "not_modelled", "NotModelledError"),
        ("graph", "2.1.0.post8", "crash", "AttributeError"),
    ],
)
def test_failure_kinds(cases, case, version, kind, error):
    report = smoke.run(cases, script=cases / "cases.py", args=[case], torch_npu_version=version)
    assert report.crash is not None and report.exit_code == 1
    assert (report.crash.kind, report.crash.type) == (kind, error)
    assert report.crash.file == "cases.py"
    label = {"not_modelled": "NOT MODELLED", "npu_op": "FUSED OP REJECTED", "crash": "CRASH"}[kind]
    assert f"{label} at cases.py:" in report.to_text()


# -- usage -------------------------------------------------------------------------------------------------


def test_usage_errors_exit_2(runs, tmp_path):
    _, migrated = runs
    base = ["--smoke", "--migrated", str(migrated)]
    assert _cli(*base).exit_code == 2  # no entry
    assert _cli(*base, "--module", "a", "--script", str(migrated / "train.py")).exit_code == 2
    assert _cli(*base, "--module", "tinylm.model", "--args", "--steps 1").exit_code == 2
    assert _cli(*base, "--script", str(tmp_path / "missing.py")).exit_code == 2
    assert _cli(*base, "--module", "tinylm.model", "--torch-npu-version", "0.1").exit_code == 2
    assert _cli("--smoke", "--migrated", str(tmp_path / "nowhere"), "--module", "m").exit_code == 2
    result = _cli(*base, "--module", "no_such_module")
    assert result.exit_code == 2 and "no module named 'no_such_module'" in result.output
    # verify without --smoke still needs --original and --factory
    assert _cli("--migrated", str(migrated)).exit_code == 2
