"""The engine below the CLI: reading and writing bytes exactly, discovery, the prefilter, safety nets."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from npu_migrate.engine.pipeline import Job, Mode, Plan, Status, migrate_text, process, unified_diff
from npu_migrate.engine.registry import select_rules
from npu_migrate.files.discovery import discover
from npu_migrate.files.source import SourceError, atomic_write

PY = lambda path: path.suffix == ".py"  # noqa: E731


def run_file(path: Path, mode: Mode = Mode.IN_PLACE):
    return process(Job(path, path.name), Plan(select_rules(), None, mode))


@pytest.mark.parametrize(
    "raw, expected",
    [
        # CRLF kept on every line, including the inserted import
        (
            b"import torch\r\nx = torch.ones(1).cuda()\r\n",
            b"import torch\r\nimport torch_npu\r\nx = torch.ones(1).npu()\r\n",
        ),
        # mixed newlines: each untouched line keeps its own ending
        (
            b"import torch\nx = 1\r\ny = torch.ones(1).cuda()\n",
            b"import torch\nimport torch_npu\nx = 1\r\ny = torch.ones(1).npu()\n",
        ),
        # no final newline
        (b"import torch\nx = torch.ones(1).cuda()", b"import torch\nimport torch_npu\nx = torch.ones(1).npu()"),
        # a BOM survives
        (
            b"\xef\xbb\xbfimport torch\nx = torch.ones(1).cuda()\n",
            b"\xef\xbb\xbfimport torch\nimport torch_npu\nx = torch.ones(1).npu()\n",
        ),
        # a latin-1 coding cookie: non-ASCII bytes written back in latin-1
        (
            b"# -*- coding: latin-1 -*-\nimport torch\nname = '\xe9t\xe9'\nx = torch.ones(1).cuda()\n",
            b"# -*- coding: latin-1 -*-\nimport torch\nimport torch_npu\nname = '\xe9t\xe9'\nx = torch.ones(1).npu()\n",
        ),
        # tabs for indentation stay tabs
        (
            b"import torch\nif True:\n\tx = torch.ones(1).cuda()\n",
            b"import torch\nimport torch_npu\nif True:\n\tx = torch.ones(1).npu()\n",
        ),
    ],
    ids=["crlf", "mixed-newlines", "no-final-newline", "bom", "latin-1", "tabs"],
)
def test_bytes_round_trip_exactly(tmp_path, raw, expected):
    path = tmp_path / "m.py"
    path.write_bytes(raw)
    result = run_file(path)
    assert result.status is Status.CHANGED, result.error
    assert path.read_bytes() == expected


def test_file_without_markers_is_not_parsed_and_stays_identical(tmp_path):
    path = tmp_path / "plain.py"
    path.write_bytes(b"import torch\nx = torch.ones(1)  \n")
    result = run_file(path)
    assert (result.status, result.parsed) == (Status.UNCHANGED, False)
    assert path.read_bytes() == b"import torch\nx = torch.ones(1)  \n"


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"def f(:\n    x.cuda()\n", "syntax error"),
        (b"print 'cuda'\n", "syntax error"),  # Python 2
        (b"x = '\xff\xfe cuda'\n", "cannot decode as utf-8"),
        (b"\x00\x01cuda\x02", "binary file"),
        (b"# -*- coding: klingon -*-\nx = 'cuda'\n", "bad coding cookie"),
    ],
    ids=["syntax", "python2", "not-utf8", "binary", "unknown-cookie"],
)
def test_bad_input_fails_the_file_with_a_reason_and_leaves_it_alone(tmp_path, raw, reason):
    path = tmp_path / "bad.py"
    path.write_bytes(raw)
    result = run_file(path)
    assert result.status is Status.FAILED
    assert reason in result.error
    assert path.read_bytes() == raw


def test_empty_file_is_fine(tmp_path):
    path = tmp_path / "empty.py"
    path.write_bytes(b"")
    assert run_file(path).status is Status.UNCHANGED


def test_file_changed_while_running_is_not_overwritten(tmp_path):
    path = tmp_path / "m.py"
    path.write_bytes(b"original")
    with pytest.raises(SourceError, match="changed on disk"):
        atomic_write(path, b"migrated", expected=b"something else")
    assert path.read_bytes() == b"original"


def test_atomic_write_keeps_the_mode_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "script.py"
    path.write_bytes(b"old")
    os.chmod(path, 0o751)
    atomic_write(path, b"new", expected=b"old")
    assert path.read_bytes() == b"new"
    assert (path.stat().st_mode & 0o777) == 0o751
    assert [p.name for p in tmp_path.iterdir()] == ["script.py"]


def test_symlinked_file_is_never_written_through(tmp_path):
    target = tmp_path / "real.py"
    target.write_bytes(b"x")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    with pytest.raises(SourceError, match="symbolic link"):
        atomic_write(link, b"y")
    assert target.read_bytes() == b"x"


def test_discovery_skips_environments_caches_symlinks_and_excludes(tmp_path):
    for rel in [
        "a.py",
        "pkg/b.py",
        "pkg/__pycache__/c.py",
        ".venv/lib/d.py",
        "build/e.py",
        "myenv/f.py",
        "pkg/tests/g.py",
        "docs/h.txt",
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text("x = 1\n")
    (tmp_path / "pkg" / "link.py").symlink_to(outside)
    found = discover([tmp_path], PY, excludes=[("pkg/tests", tmp_path)])
    names = sorted(p.relative_to(tmp_path).as_posix() for p in found.files)
    assert names == ["a.py", "pkg/b.py"]


def test_discovery_honours_gitignore_in_a_work_tree(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("generated/\nskip_me.py\n")
    for rel in ["keep.py", "skip_me.py", "generated/g.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    found = discover([tmp_path], PY)
    assert [p.name for p in found.files] == ["keep.py"]
    assert len(discover([tmp_path], PY, respect_gitignore=False).files) == 3


def test_discovery_reports_missing_paths(tmp_path):
    found = discover([tmp_path / "nope"], PY)
    assert found.files == [] and found.errors == [(str(tmp_path / "nope"), "no such file or directory")]


def test_diff_marks_a_missing_final_newline():
    diff = unified_diff("m.py", "a = 1\nb = 2", "a = 1\nb = 3")
    assert diff.endswith("-b = 2\n\\ No newline at end of file\n+b = 3\n\\ No newline at end of file\n")


@pytest.mark.parametrize(
    "before",
    [
        "import torch\n\x0c\nx = torch.ones(2).cuda()  # a\x0cb\ny = 1\n",  # form feeds: inside a line to git
        "import torch\r\nx = torch.ones(2).cuda()\r\ny = '\u2028'\r\n",
        "import torch\rx = torch.ones(2).cuda()\r",  # lone CR: one line to git
    ],
)
def test_diff_lines_are_git_lines(before, tmp_path):
    after, _ = migrate_text(before)
    assert after != before
    (tmp_path / "m.py").write_bytes(before.encode())
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    diff = unified_diff("m.py", before, after)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=diff.encode(), check=True)
    assert (tmp_path / "m.py").read_bytes() == after.encode()


@pytest.mark.parametrize(
    "source",
    [
        "from torch.cuda import synchronize as sync\nsync()\n",
        "import torch.cuda as tc\ntc.synchronize()\n",
        "from torch import cuda\ncuda.synchronize()\n",
        "import torch as th\nth.cuda.synchronize()\n",
        "import torch.cuda\ntorch.cuda.synchronize()\n",
    ],
)
def test_aliases_are_resolved(source):
    migrated, findings = migrate_text(source, select=["NPU201"])
    assert migrated != source
    assert "npu" in migrated and "cuda.synchronize" not in migrated.replace("from torch import npu as cuda\ncuda", "")
    assert all(f.fixed for f in findings)


@pytest.mark.parametrize(
    "source",
    [
        "cuda = make()\ncuda.synchronize()\n",  # a local variable called cuda
        "def f(args):\n    return args.cuda\n",  # an argparse flag
        "class M:\n    def cuda(self):\n        return self\n",  # a user method definition
        "import torch\nv = torch.version.cuda\n",  # the CUDA version string
        "import mylib as torch\ntorch.cuda.synchronize()\n",  # not torch at all
    ],
)
def test_lookalikes_are_untouched(source):
    assert migrate_text(source)[0] == source


@pytest.mark.parametrize(
    "source, rules",
    [
        # `torch.cudart` only begins like `torch.cuda`; it used to reach the torch.cuda table and fail the file
        ("import torch\nfrom torch import cudart\ncudart(args.cuda)\n", []),
        # `torch.cuda.amplify` is a torch.cuda name unknown to the tables (import and use reported), not a
        # torch.cuda.amp one
        ("import torch\nfrom torch.cuda import amplify\namplify(torch.autocast)\n", ["NPU205", "NPU205"]),
    ],
)
def test_names_that_only_begin_like_a_module_are_not_in_it(source, rules):
    migrated, findings = migrate_text(source)
    assert migrated == source
    assert [f.rule_id for f in findings] == rules


def test_a_crashing_rule_costs_one_file_not_the_run(tmp_path, monkeypatch):
    from npu_migrate.transforms import device

    def boom(self, node, func):
        raise RuntimeError("rule bug")

    monkeypatch.setattr(device.DeviceChecker, "_cuda_method", boom)
    path = tmp_path / "m.py"
    path.write_bytes(b"import torch\nx = torch.ones(1).cuda()\n")
    result = run_file(path)
    assert result.status is Status.FAILED
    assert "internal error (RuntimeError: rule bug)" in result.error
    assert path.read_bytes() == b"import torch\nx = torch.ones(1).cuda()\n"


def test_invalid_output_is_never_written(tmp_path, monkeypatch):
    import libcst as cst

    from npu_migrate.transforms import device

    # A buggy fix that builds a valid tree but invalid Python (a keyword as attribute name).
    monkeypatch.setattr(
        device.DeviceChecker,
        "_cuda_method",
        lambda self, node, func: self.report(
            device.CUDA_METHOD, func, "broken", fix=lambda u: u.with_changes(attr=cst.Name("lambda"))
        ),
    )
    path = tmp_path / "m.py"
    raw = b"import torch\nx = torch.ones(1).cuda()\n"
    path.write_bytes(raw)
    result = run_file(path)
    assert result.status is Status.FAILED
    assert "does not parse" in result.error
    assert path.read_bytes() == raw
