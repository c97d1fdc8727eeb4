"""Issue #17: `npu-migrate apply --target portable`, one codebase for CUDA, Ascend NPU and CPU.

* The option: configuration and command line, with clear errors for a bad target or torch version.
* `--torch-version` decides which `torch.accelerator` names are written (the table's `introduced`).
* A default the original had is never flipped: `--device` defaulting to "cuda" stays "cuda" on a host
  without accelerator (the upstream PR this guards against turned it into "cpu"), and becomes the NPU's type
  on an Ascend host.
* The fixture project `portable_train` (a training loop with a CPU fallback, amp, a process group, a
  hand-written RMSNorm), migrated to portable, runs on the CPU with bit-identical results to the original, and
  on the simulated NPU host picks "npu" (`tests/test_portable_cuda.py` checks the CUDA side on a GPU).
* Cross-target: portable on an npu-migrated tree, and npu on a portable one, converge.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from portable_project import PROJECT, apply, migrate, train
from typer.testing import CliRunner

from npu_migrate.cli.app import app
from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.program.api import ACCELERATOR_TYPE, PortableApi, UnknownVersionError

ROOT = Path(__file__).resolve().parent.parent
FLIPPED = ROOT / "fixtures" / "rules" / "NPU102" / "flipped_default.in.py"


# -- the option -------------------------------------------------------------------------------------------


def test_config_target_and_torch_version_reachapply(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.npu-migrate]\ntarget = "portable"\ntorch-version = "2.8.0"\n')
    (tmp_path / "step.py").write_text("import torch\n\ntorch.cuda.synchronize()\nfree = torch.cuda.mem_get_info()\n")
    result = CliRunner().invoke(app, ["apply", "--diff", str(tmp_path / "step.py")])
    assert result.exit_code == 0, result.output
    assert "+torch.accelerator.synchronize()" in result.stdout
    # get_memory_info is 2.10: with torch 2.8 chosen the accelerator's module answers instead.
    assert "torch.accelerator.get_memory_info" not in result.stdout
    assert "+free = ACCELERATOR_MODULE.mem_get_info()" in result.stdout


def test_command_line_target_wins_over_the_configuration(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.npu-migrate]\ntarget = "portable"\n')
    (tmp_path / "step.py").write_text("import torch\n\ntorch.cuda.synchronize()\n")
    result = CliRunner().invoke(app, ["apply", "--diff", "--target", "npu", str(tmp_path / "step.py")])
    assert result.exit_code == 0, result.output
    assert "+torch.npu.synchronize()" in result.stdout


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('target = "rocm"', "target: expected one of 'npu', 'portable'"),
        ("torch-version = 2.9", "torch-version: expected a string"),
    ],
)
def test_bad_target_settings_are_clear_errors(tmp_path, toml, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.npu-migrate]\n{toml}\n")
    (tmp_path / "step.py").write_text("import torch\n")
    result = CliRunner().invoke(app, ["apply", "--diff", str(tmp_path / "step.py")])
    assert result.exit_code == 2
    assert message in result.output and "pyproject.toml" in result.output


def test_unknown_torch_version_is_a_clear_error(tmp_path):
    (tmp_path / "step.py").write_text("import torch\n")
    result = CliRunner().invoke(
        app, ["apply", "--diff", "--target", "portable", "--torch-version", "1.9.0", str(tmp_path / "step.py")]
    )
    assert result.exit_code == 2
    assert "unknown torch version '1.9.0'" in result.output and "2.6.0" in result.output
    with pytest.raises(UnknownVersionError):
        PortableApi(torch_version="3.0.0")


def test_stdin_apply_takes_the_target(monkeypatch):
    result = CliRunner().invoke(
        app,
        ["apply", "-", "--stdin-filename", "step.py", "--target", "portable"],
        input="import torch\n\nx = torch.ones(2).cuda()\n",
    )
    assert result.exit_code == 0, result.output
    assert ACCELERATOR_TYPE in result.stdout.replace("\n    ", " ").replace("(\n", "").replace("\n)", "")
    assert "x = torch.ones(2).to(ACCELERATOR)" in result.stdout


# -- per torch version ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "rewritten"),
    [("2.5.0", False), ("2.6.0", True), ("2.13.0", True)],
)
def test_accelerator_names_follow_the_torch_version(version, rewritten):
    text = "import torch\n\ntorch.cuda.synchronize()\n"
    migrated, findings = migrate_text(text, select=["NPU2"], target="portable", torch_version=version)
    assert ("torch.accelerator.synchronize()" in migrated) is rewritten
    if not rewritten:  # torch.accelerator is 2.6: an older torch gets a finding that says so
        assert any("2.6.0" in f.message for f in findings)


def test_device_types_need_a_torch_that_can_name_the_accelerator_without_one():
    # 2.6's current_accelerator() raises on a host without accelerator: the "cuda" literal is reported there.
    text = 'import torch\n\nx = torch.zeros(2, device="cuda")\n'
    old, findings = migrate_text(text, select=["NPU102"], target="portable", torch_version="2.6.0")
    assert old == text and findings and not findings[0].fixed
    new, _ = migrate_text(text, select=["NPU102"], target="portable", torch_version="2.7.0")
    assert f"device={ACCELERATOR_TYPE}" in new


def test_calls_the_accelerator_cannot_take_go_to_the_accelerators_module():
    # The generic functions take their device positionally only; memory statistics raise without accelerator
    # where torch.cuda's return 0: both go to torch.cuda's own functions (torch.npu's on an Ascend host).
    text = "import torch\n\ntorch.cuda.synchronize(device=0)\nused = torch.cuda.memory_allocated()\n"
    migrated, findings = migrate_text(text, select=["NPU001", "NPU2"], target="portable")
    assert "\nACCELERATOR_MODULE.synchronize(device=0)\nused = ACCELERATOR_MODULE.memory_allocated()\n" in migrated
    assert [f.rule_id for f in findings if not f.fixed] == []
    # Without NPU001 the file cannot be given the names: the module is written in place.
    inline, _ = migrate_text(text, select=["NPU2"], target="portable")
    assert f"torch.get_device_module({ACCELERATOR_TYPE}).synchronize(" in inline


@pytest.mark.parametrize(("version", "rewritten"), [("2.6.0", False), ("2.7.0", True)])
def test_the_accelerators_module_follows_the_torch_version(version, rewritten):
    # get_device_module is 2.4, but naming the accelerator without one needs 2.7 (2.6's current_accelerator()
    # raises there): before that the call is reported with what to write.
    text = "import torch\n\ntorch.cuda.manual_seed_all(0)\n"
    migrated, findings = migrate_text(text, select=["NPU001", "NPU2"], target="portable", torch_version=version)
    assert ("ACCELERATOR_MODULE.manual_seed_all(0)" in migrated) is rewritten
    assert [f.rule_id for f in findings if not f.fixed] == ([] if rewritten else ["NPU203"])


def test_the_accelerators_module_needs_the_npu_targets_rewrite():
    # torch.npu has get_device_capability, but it answers None there (NPU204 in the npu target): not rewritten.
    text = "import torch\n\nmajor = torch.cuda.get_device_capability()[0]\nname = torch.cuda.get_arch_list()\n"
    migrated, findings = migrate_text(text, select=["NPU001", "NPU2"], target="portable")
    assert migrated == text
    assert {f.rule_id for f in findings} == {"NPU203"}


def test_the_accelerators_module_is_named_beside_an_existing_accelerator():
    first, _ = migrate_text("import torch\n\nx = torch.ones(2).cuda()\n", target="portable")
    assert "ACCELERATOR_MODULE" not in first
    second, _ = migrate_text(first + "torch.cuda.manual_seed_all(0)\n", target="portable")
    assert '    else "cuda"\n)\n# torch.npu or torch.cuda: for what torch.accelerator does not offer.\n' in second
    assert second.count("ACCELERATOR = ") == 1 and second.count("ACCELERATOR_MODULE = ") == 1
    assert second.endswith("ACCELERATOR_MODULE.manual_seed_all(0)\n")
    # A program's own ACCELERATOR_MODULE is not ours: the module is written in place.
    own, _ = migrate_text("import torch\n\nACCELERATOR_MODULE = 1\ntorch.cuda.empty_cache()\n", target="portable")
    assert own.endswith(f"ACCELERATOR_MODULE = 1\ntorch.get_device_module({ACCELERATOR_TYPE}).empty_cache()\n")


def test_device_properties_the_npu_has_are_read_from_the_accelerators_module():
    text = "import torch\n\nprops = torch.cuda.get_device_properties(0)\ngib = props.total_memory / 2**30\n"
    text += (
        "total = torch.cuda.get_device_properties(0).total_memory\nmajor = torch.cuda.get_device_properties(0).major\n"
    )
    migrated, findings = migrate_text(text, select=["NPU001", "NPU2"], target="portable")
    assert "total = ACCELERATOR_MODULE.get_device_properties(0).total_memory\n" in migrated
    # major / minor are CUDA's only, and a properties object kept in a name may be asked for them: reported.
    assert "props = torch.cuda.get_device_properties(0)\n" in migrated
    assert "major = torch.cuda.get_device_properties(0).major\n" in migrated
    assert sorted((f.line, f.rule_id) for f in findings if not f.fixed) == [(3, "NPU203"), (6, "NPU203")]


@pytest.mark.integration
def test_the_accelerators_module_is_torch_cuda_on_a_host_without_accelerator():
    import torch

    assert torch.accelerator.current_accelerator() is None, "this check is about a host without accelerator"
    source = (ROOT / "fixtures" / "rules" / "NPU001" / "accelerator_module.in.py").read_text()
    migrated, _ = migrate_text(source, select=["NPU001", "NPU201"], target="portable")
    assert "ACCELERATOR_MODULE.empty_cache()" in migrated
    before, after = _exec(source), _exec(migrated)
    assert after["ACCELERATOR_MODULE"] is torch.cuda
    for namespace in (before, after):
        namespace["seed_everything"](3)
    assert before["describe"]() == after["describe"]() == "cpu"  # empty_cache: nothing to do, as torch.cuda's


# -- devices with an index --------------------------------------------------------------------------------

INDEXED = ROOT / "fixtures" / "rules" / "NPU001" / "indexed_devices.in.py"
INDEXED_RULES = ["NPU001", "NPU101", "NPU102"]


def test_an_index_is_kept_on_the_accelerators_type():
    migrated, findings = migrate_text(INDEXED.read_text(), select=INDEXED_RULES, target="portable")
    assert (
        'torch.device(f"{ACCELERATOR}:{rank}")' in migrated and 'torch.device(f"{ACCELERATOR}:%d" % rank)' in migrated
    )
    # `.cuda(i)` takes an int or a torch.device: only an int literal or a name bound once to int(...) is rewritten.
    assert 'batch.to(f"{ACCELERATOR}:{LOCAL_RANK}")' in migrated
    assert 'batch.to(f"{ACCELERATOR}:0", non_blocking=True)' in migrated
    assert "batch.cuda(device=rank)" in migrated and "batch.cuda(device)" in migrated
    left = {f.message.split(" left as is")[0] for f in findings if not f.fixed}
    assert left == {"`.cuda(rank)`", "`.cuda(device)`", "device string in `torch.device(...)`"}


@pytest.mark.parametrize(
    "binding",
    [
        "LOCAL_RANK = int(os.environ['LOCAL_RANK'])\nLOCAL_RANK += 1\n",  # bound twice
        "LOCAL_RANK = os.environ['LOCAL_RANK']\n",  # not an int
        "from config import *\nLOCAL_RANK = 0\n",  # a star import may bind it too
        "int = str\nLOCAL_RANK = int(0)\n",  # `int` is the program's own
        "LOCAL_RANK = 0\nfor LOCAL_RANK in devices:\n    pass\n",
    ],
)
def test_a_cuda_index_not_proven_an_int_is_reported(binding):
    text = f"import os\n\nimport torch\n\n{binding}x = torch.ones(2).cuda(LOCAL_RANK)\n"
    migrated, findings = migrate_text(text, select=INDEXED_RULES, target="portable")
    assert "cuda(LOCAL_RANK)" in migrated
    assert [f.rule_id for f in findings if not f.fixed] == ["NPU101"]


@pytest.mark.integration
def test_indexed_devices_are_the_originals_on_a_host_without_accelerator():
    import torch

    source = INDEXED.read_text()
    migrated, _ = migrate_text(source, select=INDEXED_RULES, target="portable")
    before, after = _exec(source), _exec(migrated)
    assert (
        before["devices"](3)
        == after["devices"](3)
        == (torch.device("cuda:1"), torch.device("cuda:3"), torch.device("cuda:3"))
    )
    # Both fail without CUDA, as the original did (a CPU build raises RuntimeError for `.cuda(0)`, AssertionError
    # for `.to("cuda:0")`: neither runs on).
    for namespace in (before, after):
        with pytest.raises((RuntimeError, AssertionError)):
            namespace["local"](torch.ones(2))


@pytest.mark.integration
def test_indexed_devices_name_the_npu_on_an_ascend_host(tmp_path):
    migrated, _ = migrate_text(INDEXED.read_text(), select=INDEXED_RULES, target="portable")
    (tmp_path / "indexed.py").write_text(migrated)
    probe = textwrap.dedent(
        """
        import json, sys
        from npu_migrate.verify import npu_host
        npu_host.install(device_count=4)
        sys.path.insert(0, sys.argv[1])
        import torch
        import indexed
        moved = indexed.local(torch.ones(2))
        print("PROBE" + json.dumps([str(d) for d in indexed.devices(3)] + [str(moved.device)]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    assert json.loads(lines[0][len("PROBE") :]) == ["npu:1", "npu:3", "npu:3", "npu:0"]


# -- never a flipped default ------------------------------------------------------------------------------


def _exec(code: str) -> dict:
    namespace: dict = {"__name__": "migrated"}
    exec(compile(code, "migrated.py", "exec"), namespace)  # noqa: S102 - our own fixture, migrated
    return namespace


@pytest.mark.integration
def test_a_cuda_default_stays_cuda_on_a_host_without_accelerator():
    import torch

    assert torch.accelerator.current_accelerator() is None, "this check is about a host without accelerator"
    source = FLIPPED.read_text()
    migrated, _ = migrate_text(source, select=["NPU102", "NPU201"], target="portable")
    assert migrated != source
    before, after = _exec(source), _exec(migrated)
    assert before["parse"]([]).device == after["parse"]([]).device == "cuda"  # not "cpu"
    assert before["parse"]([]).eval_device == after["parse"]([]).eval_device == "cpu"
    assert before["pick"]() == after["pick"]() == torch.device("cuda")
    assert before["FALLBACK"] == after["FALLBACK"] == "cpu"


@pytest.mark.integration
def test_a_cuda_default_becomes_the_npu_on_an_ascend_host(tmp_path):
    migrated, _ = migrate_text(FLIPPED.read_text(), select=["NPU102", "NPU201"], target="portable")
    (tmp_path / "flipped.py").write_text(migrated)
    probe = textwrap.dedent(
        """
        import json, sys
        from npu_migrate.verify import npu_host
        npu_host.install()
        sys.path.insert(0, sys.argv[1])
        import flipped
        print("PROBE" + json.dumps([flipped.parse([]).device, str(flipped.pick()), flipped.FALLBACK]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    assert json.loads(lines[0][len("PROBE") :]) == ["npu", "npu", "npu"]


# -- the fixture project ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return migrate(tmp_path_factory.mktemp("portable_train"))


def test_the_project_is_migrated_to_generic_code(project):
    original, migrated, output = project
    train = (migrated / "train.py").read_text()
    # The tests that choose the device ask CUDA or the NPU, as the original asked CUDA (not MPS or XPU).
    assert "torch.cuda.is_available()" not in train and "ACCELERATOR_MODULE.is_available()" in train
    assert "torch.amp.GradScaler(" in train and "torch.cuda.amp" not in train
    assert "import torch_npu\nexcept ImportError:" in train  # guarded: the tree imports without torch_npu
    assert "_is_npu(hidden_states)" in (migrated / "trainer" / "model.py").read_text()  # the fused branch
    # One name for the accelerator per file, not a long expression at each site.
    data = (migrated / "trainer" / "data.py").read_text()
    assert "yield x.to(ACCELERATOR, non_blocking=True), y.to(ACCELERATOR, non_blocking=True)" in data
    assert data.count("current_accelerator()") == 1
    # torch.cuda.manual_seed_all: no generic counterpart, the accelerator's module has it.
    assert "    ACCELERATOR_MODULE.manual_seed_all(args.seed)\n" in train and "NPU203" not in output
    again = apply(str(migrated), "--target", "portable", "--check")
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.integration
def test_the_migrated_project_trains_bit_identically_on_the_cpu(project):
    original, migrated, _ = project
    before, after = train(original, "--amp"), train(migrated, "--amp")
    assert after["device"] == "cpu" and after["eval_device"] == "cuda"  # the fallback and the default, kept
    assert after["backend"] == "gloo"
    assert after == before


@pytest.mark.integration
def test_the_migrated_project_picks_the_npu_on_an_ascend_host(project):
    from npu_migrate.verify import smoke

    original, migrated, _ = project
    report = smoke.run(migrated, script=migrated / "train.py", args=["--steps", "2", "--amp"], original=original)
    assert report.passed, report.to_text(verbose=True)
    result = json.loads(report.output_tail.split("RESULT ", 1)[1].splitlines()[0])
    assert result["device"] == result["eval_device"] == "npu"
    assert result["devices"] == 1
    assert "npu_rms_norm" in report.to_text()  # the fused branch runs there, as in the npu target


#: A host whose accelerator is not CUDA's nor the NPU's (Apple MPS), as torch.accelerator reports it there.
MPS_HOST = """
import torch
torch.accelerator.current_accelerator = lambda check_available=False: torch.device("mps")
torch.accelerator.is_available = lambda: True
torch.accelerator.device_count = lambda: 1
print("HOST", torch.accelerator.current_accelerator().type, torch.accelerator.is_available(), torch.cuda.is_available())
"""


@pytest.mark.integration
def test_the_migrated_project_falls_back_to_the_cpu_on_an_mps_host(project):
    # The original asks torch.cuda, finds no GPU and trains on the CPU; the migrated code must too, not on "mps".
    original, migrated, _ = project
    before, after = train(original, "--amp", host=MPS_HOST), train(migrated, "--amp", host=MPS_HOST)
    assert after["device"] == "cpu" and after["eval_device"] == "cuda" and after["backend"] == "gloo"
    assert after == before


def test_the_simulated_mps_host_reports_mps(tmp_path):
    # The check above means something only if torch.accelerator answers "mps" there.
    proc = subprocess.run([sys.executable, "-c", MPS_HOST], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "HOST mps True False" in proc.stdout


def test_an_accelerator_written_by_an_earlier_version_is_updated():
    legacy = (
        "import torch\n\n"
        'ACCELERATOR = getattr(torch.accelerator.current_accelerator(), "type", "cuda")\n\n'
        "x = torch.ones(2).to(ACCELERATOR)\ny = torch.ones(2).cuda()\n"
    )
    migrated, _ = migrate_text(legacy, target="portable")
    assert "ACCELERATOR = getattr(" not in migrated and migrated.count("ACCELERATOR = ") == 1
    assert 'else "cuda"\n)\n' in migrated and migrated.endswith("y = torch.ones(2).to(ACCELERATOR)\n")
    again, _ = migrate_text(migrated, target="portable")
    assert again == migrated


# -- across targets ---------------------------------------------------------------------------------------


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.py"))}


@pytest.mark.parametrize(("first", "second"), [("npu", "portable"), ("portable", "npu")])
def test_one_target_after_the_other_converges(tmp_path, first, second):
    once, twice, thrice = tmp_path / "once", tmp_path / "twice", tmp_path / "thrice"
    outputs = []
    for source, out, target in ((PROJECT, once, first), (once, twice, second), (twice, thrice, second)):
        proc = apply(str(source), "--target", target, "--output", str(out))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs.append(proc.stdout)
    assert _tree(thrice) == _tree(twice), f"--target {second} after --target {first} must converge"
    if second == "portable":  # it leaves the NPU code as it is, and says so
        assert "NPU002" in outputs[1] and "written for torch_npu" in outputs[1]
    imports = [text.count(b"import torch_npu") for text in _tree(twice).values()]
    assert max(imports) == 1, "one import of torch_npu per file, whichever target came first"


def test_an_earlier_accelerator_stays_while_the_earlier_device_tests_read_it():
    # Those tests say True on an MPS host: under the new "cuda" there they would send it to CUDA (review).
    legacy = (
        "import torch\n\n"
        'ACCELERATOR = getattr(torch.accelerator.current_accelerator(), "type", "cuda")\n\n'
        'device = ACCELERATOR if torch.accelerator.is_available() else "cpu"\ntorch.cuda.empty_cache()\n'
    )
    migrated, findings = migrate_text(legacy, target="portable")
    assert 'ACCELERATOR = getattr(torch.accelerator.current_accelerator(), "type", "cuda")\n' in migrated
    assert "ACCELERATOR_MODULE.empty_cache()" in migrated
    assert any("earlier npu-migrate" in f.message and "kept" in f.message for f in findings)
    assert migrate_text(migrated, target="portable")[0] == migrated
