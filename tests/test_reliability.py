"""The safety promise: never lose or corrupt a file, never write code that does not parse, never let one
odd file end the run, never execute the code being migrated. Issue 9's bad-input matrix lives here."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from test_cli import run_cli

from npu_migrate.engine import pipeline, runner
from npu_migrate.engine.pipeline import Job, Mode, Plan, Status
from npu_migrate.engine.registry import select_rules

CUDA = b"import torch\nx = torch.ones(1).cuda()\n"
MIGRATED = b"import torch\nimport torch_npu\nx = torch.ones(1).npu()\n"


def plan(mode=Mode.IN_PLACE, **kw):
    return Plan(select_rules(), None, mode, **kw)


@pytest.mark.parametrize(
    "name, raw, reason",
    [
        ("syntax.py", b"def f(:\n    x.cuda()\n", "syntax error at line 1"),
        ("py2.py", b"print 'on cuda'\n", "syntax error at line 1"),
        ("latin.py", b"x = '\xe9 cuda'\n", "cannot decode as utf-8"),
        ("binary.py", b"\x7fELF\x00\x00cuda\x00", "binary file"),
        ("nested.py", b"x = " + b"(" * 5000 + b"cuda" + b")" * 5000 + b"\n", "too many nested parentheses"),
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_the_run_goes_on(tmp_path, name, raw, reason):
    (tmp_path / name).write_bytes(raw)
    (tmp_path / "good.py").write_bytes(CUDA)
    result = run_cli("apply", "--force", ".", cwd=tmp_path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(f"{name}: error: ") and reason in errors[0]
    assert "Traceback" not in result.stderr
    assert (tmp_path / name).read_bytes() == raw
    assert (tmp_path / "good.py").read_bytes() == MIGRATED


def test_unreadable_file_is_reported(tmp_path, monkeypatch):
    path = tmp_path / "secret.py"
    path.write_bytes(CUDA)
    if os.geteuid() == 0:  # root reads anything: simulate what the permission bits do for everyone else
        original = Path.read_bytes

        def denied(self):
            if self == path:
                raise PermissionError(13, "Permission denied")
            return original(self)

        monkeypatch.setattr(Path, "read_bytes", denied)
    else:
        path.chmod(0)
    result = pipeline.process(Job(path, "secret.py"), plan())
    assert (result.status, result.error) == (Status.FAILED, "cannot read: Permission denied")


def test_read_only_file_is_reported_and_left_whole(tmp_path):
    path = tmp_path / "frozen.py"
    path.write_bytes(CUDA)
    path.chmod(0o444)
    result = run_cli("apply", "--force", "frozen.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "frozen.py: error: file is read-only; not written" in result.stderr
    assert path.read_bytes() == CUDA
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".npu_migrate_cache") == ["frozen.py"]


def test_symlink_loop_and_links_out_of_the_tree_are_never_followed(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").symlink_to(tree / "b.py")
    (tree / "b.py").symlink_to(tree / "a.py")
    outside = tmp_path / "outside.py"
    outside.write_bytes(CUDA)
    (tree / "escape.py").symlink_to(outside)
    (tree / "loopdir").symlink_to(tree, target_is_directory=True)
    (tree / "real.py").write_bytes(CUDA)
    result = run_cli("apply", "--force", "tree", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert outside.read_bytes() == CUDA
    assert (tree / "real.py").read_bytes() == MIGRATED
    explicit = run_cli("apply", "--force", "tree/escape.py", cwd=tmp_path)
    assert explicit.returncode == 2 and "symbolic link; not written through" in explicit.stderr
    assert outside.read_bytes() == CUDA
    loop = run_cli("apply", "tree/a.py", cwd=tmp_path)
    assert loop.returncode == 2 and "tree/a.py: error:" in loop.stderr


def test_fifo_named_py_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    result = pipeline.process(Job(tmp_path / "pipe.py", "pipe.py"), plan())
    assert result.status is Status.FAILED and "not a regular file" in result.error


def test_file_edited_during_the_run_is_not_overwritten(tmp_path, monkeypatch):
    path = tmp_path / "busy.py"
    path.write_bytes(CUDA)
    real = pipeline.migrate_source

    def slow_user_edits_meanwhile(*args, **kwargs):
        outcome = real(*args, **kwargs)
        path.write_bytes(CUDA + b"# edited by the user while npu-migrate ran\n")
        return outcome

    monkeypatch.setattr(pipeline, "migrate_source", slow_user_edits_meanwhile)
    result = pipeline.process(Job(path, "busy.py"), plan())
    assert result.status is Status.FAILED and "changed on disk" in result.error
    assert path.read_bytes().endswith(b"# edited by the user while npu-migrate ran\n")


def test_output_never_writes_through_a_symlink_that_leaves_it(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_bytes(CUDA)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "pkg").symlink_to(elsewhere, target_is_directory=True)
    result = run_cli("apply", "src", "--output", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert "leads outside" in result.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_path_that_does_not_exist_is_an_error_and_the_rest_runs(tmp_path):
    (tmp_path / "good.py").write_bytes(CUDA)
    result = run_cli("apply", "--force", "good.py", "missing.py", cwd=tmp_path)
    assert result.returncode == 2 and "missing.py: error: no such file or directory" in result.stderr
    assert (tmp_path / "good.py").read_bytes() == MIGRATED


def test_per_file_timeout_fails_only_that_file(tmp_path):
    # 10 MB of calls that all need rewriting: far more than a 1 s budget.
    big = tmp_path / "big.py"
    big.write_bytes(b"import torch\n" + b"x = torch.ones(1).cuda()\n" * 420_000)
    assert big.stat().st_size > 10_000_000
    (tmp_path / "small.py").write_bytes(CUDA)
    start = time.monotonic()
    result = run_cli("apply", "--force", "--timeout", "1", ".", cwd=tmp_path)
    assert time.monotonic() - start < 60
    assert result.returncode == 2
    assert "big.py: error: took longer than 1 s (--timeout); file left untouched" in result.stderr
    assert big.read_bytes().count(b".cuda()") == 420_000
    assert (tmp_path / "small.py").read_bytes() == MIGRATED


def test_ten_megabyte_file_without_cuda_costs_a_read_not_a_parse(tmp_path):
    big = tmp_path / "big.py"
    big.write_bytes(b"x = 1\n" * 1_800_000)
    result = pipeline.process(Job(big, "big.py"), plan())
    assert (result.status, result.parsed) == (Status.UNCHANGED, False)


def _crash_on_marked_files(job, plan):
    if job.path.name.startswith("crash"):
        # pytest enables faulthandler, which the forked worker inherits: its dump of every thread's stack
        # would fill the test log for a crash that is the point of the test.
        faulthandler.disable()
        os.abort()  # what a segfault in a native parser does to a worker
    return pipeline.process(job, plan)


def test_a_worker_that_dies_costs_one_file_not_the_run(tmp_path, monkeypatch):
    jobs = []
    for i in range(20):
        name = f"crash{i}.py" if i == 9 else f"m{i:02d}.py"
        (tmp_path / name).write_bytes(CUDA)
        jobs.append(Job(tmp_path / name, name))
    monkeypatch.setattr(runner, "process", _crash_on_marked_files)
    results = list(runner.run(jobs, plan(Mode.DIFF), workers=2))
    assert [r.display for r in results] == [j.display for j in jobs]
    failed = [r for r in results if r.status is Status.FAILED]
    assert [r.display for r in failed] == ["crash9.py"] and "worker process died" in failed[0].error
    assert all(r.status is Status.CHANGED for r in results if r.display != "crash9.py")


def test_a_worker_that_dies_during_analyze_costs_one_file_not_the_analysis(tmp_path, monkeypatch):
    from npu_migrate.analyze import core
    from npu_migrate.analyze.project import WORKER_DIED, Settings

    for i in range(20):
        (tmp_path / (f"crash{i}.py" if i == 9 else f"m{i:02d}.py")).write_bytes(CUDA)
    # The workers are forked from this process, so they run the patched pipeline too.
    monkeypatch.setattr(core, "process", _crash_on_marked_files)
    settings = Settings(modes=("torch_apis",), enabled=select_rules(), jobs=2)
    analysis = core.analyse([tmp_path], settings)
    assert [f.display for f in analysis.files] == sorted(p.name for p in tmp_path.iterdir())
    assert analysis.errors == [("crash9.py", WORKER_DIED)]
    cuda_calls = {f.path for f in analysis.findings if f.rule_id == "NPU101"}
    assert cuda_calls == {f"m{i:02d}.py" for i in range(20) if i != 9}
    assert all("torch_apis" in f.facts for f in analysis.files if f.display != "crash9.py")


def test_sigkill_in_the_middle_of_an_in_place_run_leaves_every_file_whole(tmp_path):
    files = []
    for i in range(400):
        path = tmp_path / f"m{i:03d}.py"
        body = b"import torch\n" + b"".join(b"x%d = torch.ones(%d).cuda()\n" % (j, j) for j in range(40))
        path.write_bytes(body)
        files.append((path, body))
    proc = subprocess.Popen(
        [sys.executable, "-m", "npu_migrate", "apply", "--force", "--jobs", "1", "."],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        migrated = sum(b"torch_npu" in p.read_bytes() for p, _ in files[:200])
        if migrated >= 20:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    originals = migrated_count = 0
    for path, body in files:
        data = path.read_bytes()
        expected = pipeline.migrate_text(body.decode())[0].encode()
        assert data in (body, expected), f"{path.name} is neither the original nor the migrated file"
        originals += data == body
        migrated_count += data == expected
    assert migrated_count >= 20 and originals > 0, "the kill should land mid-run"
    leftovers = [p.name for p in tmp_path.iterdir() if not p.name.endswith(".py") and p.name != ".npu_migrate_cache"]
    assert all(name.endswith(".npu-migrate.tmp") for name in leftovers)


#: The CUDA-only packages fused fixtures import; none is installed where the tests run.
_CUDA_ONLY = ("flash_attn", "xformers")


@pytest.mark.integration
def test_migrated_fused_fixtures_behave_like_the_originals_without_torch_npu(tmp_path):
    """The injected prelude and branches change nothing where torch_npu is absent: every module-level
    function and nn.Module of the fused fixtures gives bit-identical results before and after."""
    import torch

    fixtures = sorted(Path(__file__).parent.parent.glob("fixtures/rules/NPU7*/*.out.py"))
    assert fixtures
    compared = 0
    for out in fixtures:
        try:
            original = _exec(out.with_name(out.name.replace(".out.py", ".in.py")))
        except ModuleNotFoundError as exc:
            # A CUDA-only package (flash_attn, xformers) the original imports unconditionally: nothing runs
            # here to compare with. The migrated file imports (NPU705 / NPU708 made the import conditional)
            # or fails alike (an import they report and leave).
            assert exc.name.split(".")[0] in _CUDA_ONLY, exc
            try:
                _exec(out)
            except ModuleNotFoundError as again:
                assert again.name.split(".")[0] in _CUDA_ONLY, again
            fixtures = [f for f in fixtures if f != out]
            continue
        migrated = _exec(out)
        assert migrated["torch_npu"] is None and migrated["_is_npu"](torch.ones(1)) is False
        exercised, needs_flash_attn = compared, False
        for name, obj in original.items():
            if isinstance(obj, type) and issubclass(obj, torch.nn.Module) and obj is not torch.nn.Module:
                compared += _compare_module(torch, obj, migrated[name])
            elif callable(obj) and getattr(obj, "__module__", None) == "fixture" and not name.startswith("_"):
                try:
                    compared += _compare_function(torch, obj, migrated[name])
                except ModuleNotFoundError as exc:
                    assert exc.name.split(".")[0] in _CUDA_ONLY, exc
                    needs_flash_attn = True
        source = out.read_text()
        imports_cuda_only = any(f"import {p}" in source or f"from {p}" in source for p in _CUDA_ONLY)
        if (needs_flash_attn or imports_cuda_only) and compared == exercised:
            # Every function needs the CUDA-only package where it runs (it imports it, or calls through a
            # try-import that left None here): nothing runs here to compare with.
            fixtures = [f for f in fixtures if f != out]
    assert compared >= len(fixtures) - 2, "most fused fixtures must be exercised, not just imported"


def _exec(path):
    """The fixture run as the module `fixture`: TorchScript (`@torch.jit.script` at import) reads its source
    through the file name and resolves its annotations through `sys.modules`."""
    module = types.ModuleType("fixture")
    module.__file__ = str(path)
    sys.modules["fixture"] = module
    try:
        exec(compile(path.read_text(), str(path), "exec"), vars(module))
    finally:
        del sys.modules["fixture"]
    return vars(module)


def _compare_function(torch, original, migrated) -> int:
    import inspect

    params = [p for p in inspect.signature(original).parameters.values() if p.default is p.empty]
    torch.manual_seed(0)
    args = [torch.randn(2, 3, 8) for _ in params]
    try:
        expected = original(*args)
    except ModuleNotFoundError:
        raise  # flash_attn, imported where the function runs: the caller counts the fixture out
    except Exception:
        return 0
    assert _identical(torch, migrated(*args), expected), original.__name__
    return 1


def _identical(torch, a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_identical(torch, x, y) for x, y in zip(a, b))
    if not isinstance(a, torch.Tensor):  # a fixture's helper (`exists(val)`): a plain value
        return type(a) is type(b) and a == b
    return torch.equal(a, b)


def _compare_module(torch, original_cls, migrated_cls) -> int:
    import types

    config = types.SimpleNamespace(hidden_size=8, intermediate_size=16, hidden_act="silu", rms_norm_eps=1e-6)
    for args in ((8,), (8, 16), (), (config,)):
        try:
            torch.manual_seed(0)
            a = original_cls(*args)
            torch.manual_seed(0)
            b = migrated_cls(*args)
        except Exception:  # this constructor wants other arguments (a config object, ...)
            continue
        with torch.no_grad():
            for p in a.parameters():
                p.normal_()  # not the all-ones/zeros init, so weight handling is exercised
            b.load_state_dict(a.state_dict())
            x = torch.randn(2, 3, 8)
            try:
                torch.manual_seed(1)  # the same dropout masks for both, in training mode
                expected = a(x)
            except Exception:
                return 0
            torch.manual_seed(1)
            assert _identical(torch, b(x), expected), original_cls.__name__
        return 1
    return 0


def test_the_output_tree_keeps_each_file_s_mode(tmp_path):
    # A launch script copied without its executable bit no longer starts with `./train.sh`; a module
    # written with mkstemp's 0600 is hidden from the group that runs the training job.
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.sh").write_text("#!/bin/sh\nexport CUDA_VISIBLE_DEVICES=0\npython m.py\n")
    (src / "m.py").write_bytes(CUDA)
    (src / "plain.py").write_text("x = 1\n")
    modes = {"train.sh": 0o755, "m.py": 0o644, "plain.py": 0o640}
    for name, mode in modes.items():
        (src / name).chmod(mode)
    result = run_cli("apply", "src", "--output", "out", cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    assert (tmp_path / "out" / "train.sh").read_text() != (src / "train.sh").read_text()  # migrated, not copied
    for name, mode in modes.items():
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == mode, name
