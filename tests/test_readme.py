"""README's command examples run as written (issue #25: "a new user's path").

Each ```bash block of README.md runs, line by line, in a fresh workspace: a git repository holding what
the examples name (`train.py`, `src/`, `vendor/lib`, the bundled `examples/` and `fixtures/projects/`,
and README's own `factory.py`), with this environment's `npu-migrate` and `python` first on PATH. Paths
under /tmp/ are moved into the test's own folder. A command may exit 0, or 1 where it is a `--check`
(that is its answer); never 2, never a traceback. The lines that need the network, a GPU or this
repository's own checkout (installing, the whole test suite, regenerating the tables) are listed in
`NOT_RUN` with the reason; a README line that matches none of them runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"

#: Line prefixes not run, with why: what they do is what the test environment already is, or needs
#: the network.
NOT_RUN = {
    "python3.11 -m venv .venv && .venv/bin/pip install . && ": "installs (this environment is the installed one)",
    "bash .ci/run": "the whole test suite and lint",
    "python3.11 -m venv .venv && .venv/bin/pip install -e": "installs the development environment",
    ".venv/bin/python -m pytest": "the test suite itself",
    ".venv/bin/python scripts/generate_api_tables.py": "downloads ~450 MB of wheels",
    "pip download": "needs the network",
}
#: NOT_RUN lines whose block is not run at all: the lines after them read what they download.
WHOLE_BLOCK = ("pip download",)

CUDA_TRAIN = """\
import torch

model = torch.nn.Linear(4, 4).cuda()
x = torch.randn(2, 4, device="cuda")
print(torch.cuda.get_device_name(0), model(x).sum().item())
"""
LIBRARY = """\
import torch


def to_gpu(x):
    return x.cuda()
"""


def _blocks() -> list[tuple[int, list[str]]]:
    """(README line, command lines) of each ```bash block; continuation lines joined, comments dropped."""
    text = README.read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"```bash\n(.*?)```", text, re.S):
        joined = match.group(1).replace("\\\n", " ")
        lines = [line.strip() for line in joined.splitlines()]
        commands = [line for line in lines if line and not line.startswith("#")]
        blocks.append((text[: match.start()].count("\n") + 1, commands))
    return blocks


def _factory() -> str:
    text = README.read_text(encoding="utf-8")
    (code,) = re.findall(r"```python\n(# factory\.py.*?)```", text, re.S)
    return code


def _runnable(command: str) -> str | None:
    """The command to run, or None where it is in NOT_RUN. The install prefix of README's first line is
    dropped: what follows it (`.venv/bin/npu-migrate ...`) runs with this environment's npu-migrate."""
    for prefix in NOT_RUN:
        if command.startswith(prefix):
            rest = command[len(prefix) :]
            return rest.replace(".venv/bin/", "") if rest.startswith(".venv/bin/npu-migrate") else None
    return command


BLOCKS = _blocks()


def _needs(commands: list[str]) -> set[str]:
    text = " ".join(commands)
    needs = set()
    if "verify" in text:
        needs.add("torch")
    if "transformers" in text:
        needs.add("transformers")
    return needs


def _workspace(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(CUDA_TRAIN)
    shutil.copytree(ROOT / "examples" / "tiny_cnn", work / "src")
    shutil.copytree(ROOT / "examples", work / "examples")
    for project in ("smoke_runs", "smoke_guard"):
        shutil.copytree(ROOT / "fixtures" / "projects" / project, work / "fixtures" / "projects" / project)
    (work / "vendor" / "lib" / "gpulib").mkdir(parents=True)
    (work / "vendor" / "lib" / "gpulib" / "__init__.py").write_text(LIBRARY)
    (work / "factory.py").write_text(_factory())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "the code to migrate"], cwd=work, check=True)
    return work


def _marks(commands):
    needs = _needs(commands)
    marks = []
    if needs:
        marks.append(pytest.mark.integration)
    if "transformers" in needs:
        marks.append(pytest.mark.slow)  # migrates the whole installed transformers package
    return marks


@pytest.mark.parametrize(
    "line, commands",
    [pytest.param(line, commands, id=f"README-line-{line}", marks=_marks(commands)) for line, commands in BLOCKS],
)
def test_readme_block_runs_as_written(line, commands, tmp_path):
    if any(c.startswith(WHOLE_BLOCK) for c in commands):
        pytest.skip("the block starts from a download: " + NOT_RUN[next(p for p in WHOLE_BLOCK)])
    runnable = [c for c in map(_runnable, commands) if c]
    if not runnable:
        pytest.skip("every line of this block is in NOT_RUN: " + "; ".join(commands))
    work = _workspace(tmp_path)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env["NO_COLOR"] = "1"
    # One shell for the block, as a reader pastes it (`TF=...` is read by the lines after it); each
    # command's exit status is written to a file of its own.
    script = ["set -o pipefail"]
    for i, command in enumerate(runnable):
        script += [command.replace("/tmp/", f"{private_tmp}/"), f"echo $? > {tmp_path}/rc{i}"]
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=work,
        input="q\n",  # `apply --interactive` reads its answers: quit at the first hunk
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    said = f"README.md:{line}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr and "npu-migrate: error" not in result.stderr, said
    for i, command in enumerate(runnable):
        code = int((tmp_path / f"rc{i}").read_text())
        allowed = (0, 1) if "--check" in command else (0,)
        assert code in allowed, f"exit {code} from README.md:{line}: {command}\n{said}"
    if any("verify" in command for command in runnable):
        assert result.stdout.count("result: PASS") == sum("verify" in c for c in runnable), said


def test_every_line_not_run_is_still_in_the_readme():
    """NOT_RUN cannot silently grow stale: each prefix still starts a README line."""
    lines = [c for _, commands in BLOCKS for c in commands]
    for prefix in NOT_RUN:
        assert any(c.startswith(prefix) for c in lines), prefix
