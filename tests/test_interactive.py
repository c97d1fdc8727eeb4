"""`apply --interactive`: scripted answers on stdin; the result is the migrated text restricted to the
accepted hunks, and nothing is written unless the whole review ends normally."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npu_migrate.engine.pipeline import Job, Mode, Plan
from npu_migrate.engine.registry import select_rules
from npu_migrate.files.source import read_source
from npu_migrate.output.interactive import Review, ask, link, prepare, restrict, split_hunks, write_all
from npu_migrate.program.api import NpuApi

GAP = "\n" * 8  # more than twice the diff context: the changes below are separate hunks
TWO_HUNKS = f"import torch\n\nx = torch.ones(1).cuda(){GAP}torch.cuda.synchronize()\n"
OTHER = f"import torch\n{GAP}y = torch.zeros(1).cuda()\n"
THREE_HUNKS = f"import torch\n{GAP}x = torch.ones(1).cuda(){GAP}torch.cuda.synchronize()\n"
ATTENTION = f"""import torch
import torch.nn.functional as F
{GAP}
def attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""


def review(answers: str, *paths: str, cwd: Path):
    return subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", "--interactive", *paths],
        input=answers,
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


@pytest.fixture
def project(tmp_path):
    (tmp_path / "a.py").write_text(TWO_HUNKS)
    (tmp_path / "b.py").write_text(OTHER)
    return tmp_path


def migrated_by_apply(project: Path, tmp_path_factory) -> dict[str, str]:
    copy = tmp_path_factory.mktemp("applied")
    shutil.copytree(project, copy, dirs_exist_ok=True)
    subprocess.run([sys.executable, "-m", "npu_migrate", "apply", "."], cwd=copy, check=True, capture_output=True)
    return {name: (copy / name).read_text() for name in ("a.py", "b.py")}


def test_accepting_every_hunk_is_apply_and_none_leaves_the_files_alone(project, tmp_path_factory):
    expected = migrated_by_apply(project, tmp_path_factory)
    none = review("n\n" * 4, ".", cwd=project)  # two hunks in each file
    assert none.returncode == 0, none.stderr
    assert (project / "a.py").read_text() == TWO_HUNKS and (project / "b.py").read_text() == OTHER
    every = review("y\n" * 4, ".", cwd=project)
    assert every.returncode == 0, every.stderr
    assert {name: (project / name).read_text() for name in expected} == expected


def test_each_hunk_is_applied_independently_and_the_rule_is_shown_above_it(project):
    (project / "a.py").write_text(THREE_HUNKS)  # the import, the .cuda() and the synchronize are apart
    result = review("n\nn\ny\nd\n", ".", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "# NPU201 [fixed]" in result.stdout and "(3/3) Apply this hunk to a.py" in result.stdout
    a = (project / "a.py").read_text()
    assert "torch.npu.synchronize()" in a and ".cuda()" in a
    assert (project / "b.py").read_text() == OTHER, "d: the rest of b.py skipped"


def test_a_hunk_that_needs_torch_npu_brings_the_import_hunk_and_says_so(project):
    (project / "a.py").write_text(THREE_HUNKS)
    result = review("n\nn\ny\nd\n", "a.py", "b.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "# needs hunk 1/3, which adds `torch_npu`: applying this hunk applies it too" in result.stdout
    assert "# hunk 1/3 applied too: it adds `torch_npu`, which hunk 3 uses" in result.stdout
    a = (project / "a.py").read_text()
    assert a.startswith("import torch\nimport torch_npu\n") and a.count("import torch_npu") == 1
    assert ".cuda()" in a, "the .npu() hunk was declined and nothing needs it"


def test_a_declined_import_is_not_brought_back_when_nothing_accepted_needs_it(project):
    (project / "a.py").write_text(THREE_HUNKS)
    result = review("n\nn\nn\nd\n", "a.py", "b.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert (project / "a.py").read_text() == THREE_HUNKS


def test_a_call_of_a_helper_brings_the_hunk_that_defines_it(tmp_path):
    (tmp_path / "s.py").write_text(ATTENTION)
    # the SDPA wrapper is opt-in (NPU707): NPU704 leaves the call native
    (tmp_path / "pyproject.toml").write_text("[tool.npu-migrate]\nfused = { fused-sdpa = true }\n")
    result = review("n\ny\n", "s.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "adds `_npu_sdpa`" in result.stdout
    migrated = (tmp_path / "s.py").read_text()
    assert "return _npu_sdpa(q, k, v, is_causal=True)" in migrated and "def _npu_sdpa(" in migrated
    namespace: dict = {}
    exec(compile(migrated, "s.py", "exec"), namespace)  # defines every name it uses (torch_npu may be absent)
    assert callable(namespace["attend"])


def test_an_earlier_hunk_needing_a_later_one_applies_it_without_asking(tmp_path):
    before = f"import torch\n\nx = torch.ones(1)\n{GAP}"
    after = f"import torch\n\nx = helper(torch.ones(1))\n{GAP}def helper(t):\n    return t\n"
    (tmp_path / "h.py").write_text(before)
    hunks = split_hunks("h.py", before, after, [])
    link(hunks, before, after)
    assert [h.needs for h in hunks] == [{1: "helper"}, {}]
    said: list[str] = []
    path = tmp_path / "h.py"
    reviewed = Review(Job(path, "h.py"), read_source(path), "python", after, hunks)
    ask(reviewed, lambda prompt: "y", said.append)
    assert reviewed.accepted == {0, 1} and reviewed.result() == after
    assert "(2/2) applied: a hunk accepted before needs it\n" in said


def test_a_then_q_and_help(project):
    result = review("?\na\nq\n", ".", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "d - do not apply this hunk or any of the later hunks" in result.stdout
    assert ".cuda" not in (project / "a.py").read_text(), "a: this hunk and the later ones in the file"
    assert (project / "b.py").read_text() == OTHER, "q: nothing more"


def test_an_interrupted_review_writes_nothing_not_even_the_files_already_accepted(project):
    result = review("y\ny\n", ".", cwd=project)  # the input ends before b.py's hunk is answered
    assert result.returncode == 2
    assert "review interrupted; nothing written" in result.stderr
    assert (project / "a.py").read_text() == TWO_HUNKS


def test_a_file_that_cannot_be_read_for_review_stops_every_write(project):
    (project / "c.py").write_bytes(b"\xff\xfe\x00bad")
    result = review("y\n" * 4, "a.py", "c.py", cwd=project)
    assert result.returncode == 2
    assert "c.py: error:" in result.stderr and "nothing written" in result.stderr
    assert (project / "a.py").read_text() == TWO_HUNKS


def test_interactive_cannot_be_combined_with_a_dry_run(project):
    result = review("", "--diff", ".", cwd=project)
    assert result.returncode == 2 and "--interactive rewrites in place" in result.stderr


def _reviewed(path: Path) -> Review:
    plan = Plan(select_rules(None, None), None, Mode.IN_PLACE)
    found = prepare(Job(path, path.name), plan, NpuApi(None))
    assert found is not None
    return found


def test_a_file_changed_during_the_review_refuses_every_write(project):
    a, b = _reviewed(project / "a.py"), _reviewed(project / "b.py")
    a.accepted, b.accepted = {0, 1}, {0}
    (project / "b.py").write_text(OTHER + "# edited meanwhile\n")
    errors, written = write_all([a, b])
    assert errors == [("b.py", "changed on disk during the review; not overwritten")] and not written
    assert (project / "a.py").read_text() == TWO_HUNKS


def test_a_partial_acceptance_that_does_not_parse_is_refused(tmp_path):
    before = "values = [\n" + "    1,\n" * 8 + "]\n"
    after = "values = (\n" + "    1,\n" * 8 + ")\n"
    (tmp_path / "v.py").write_text(before)
    hunks = split_hunks("v.py", before, after, [])
    assert len(hunks) == 2
    path = tmp_path / "v.py"
    partial = Review(Job(path, "v.py"), read_source(path), "python", after, hunks, accepted={0})
    [(name, reason)], written = write_all([partial])
    assert not written
    assert name == "v.py" and "the accepted hunks alone do not parse" in reason
    assert path.read_text() == before


@pytest.mark.parametrize("accepted", [(), (0,), (1,), (0, 1)])
def test_restrict_takes_exactly_the_accepted_hunks(accepted):
    after = TWO_HUNKS.replace(".cuda()", ".npu()").replace("torch.cuda.", "torch.npu.")
    hunks = split_hunks("a.py", TWO_HUNKS, after, [])
    result = restrict(TWO_HUNKS, after, [hunks[i] for i in accepted])
    assert (".npu()" in result) == (0 in accepted)
    assert ("torch.npu.synchronize" in result) == (1 in accepted)
    assert result.count("\n") == TWO_HUNKS.count("\n")
