"""Files other than Python: notebooks, launch scripts, Dockerfiles, .env, YAML and CUDA sources."""

from __future__ import annotations

import json
import shutil
import subprocess

import nbformat
from conftest import FIXTURES
from test_cli import run_cli

NOTEBOOK = FIXTURES / "rules" / "NPU201" / "notebook.in.ipynb"


def test_notebook_cells_are_migrated_with_outputs_and_metadata_untouched(tmp_path):
    shutil.copy(NOTEBOOK, tmp_path / "train.ipynb")
    result = run_cli("apply", "--force", "train.ipynb", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    before = json.loads(NOTEBOOK.read_text())
    after_text = (tmp_path / "train.ipynb").read_text()
    nbformat.validate(nbformat.reads(after_text, as_version=nbformat.NO_CONVERT))
    after = json.loads(after_text)
    code = "".join(after["cells"][2]["source"])
    assert "x = torch.ones(2).npu()" in code and "torch.npu.synchronize()" in code
    assert code.startswith("!nvidia-smi\n"), "IPython magics are restored verbatim"
    assert after["cells"][1]["source"] == ["import torch\n", "import torch_npu\n", "%matplotlib inline"]
    assert after["cells"][0] == before["cells"][0], "markdown mentioning cuda is prose"
    for key in ("outputs", "metadata", "execution_count", "id"):
        assert after["cells"][2][key] == before["cells"][2][key]
    assert after["metadata"] == before["metadata"]
    again = run_cli("apply", "--force", "--check", "train.ipynb", cwd=tmp_path)
    assert again.returncode == 0, again.stdout


def test_notebook_diff_is_a_patch_git_applies(tmp_path):
    shutil.copy(NOTEBOOK, tmp_path / "train.ipynb")
    diff = run_cli("apply", "--diff", "train.ipynb", cwd=tmp_path).stdout
    assert '+    "x = torch.ones(2).npu()\\n",' in diff
    patched = tmp_path / "patched"
    patched.mkdir()
    shutil.copy(NOTEBOOK, patched / "train.ipynb")
    subprocess.run(["git", "init", "-q"], cwd=patched, check=True)
    subprocess.run(["git", "apply", "-"], cwd=patched, input=diff, text=True, check=True)
    run_cli("apply", "--force", "train.ipynb", cwd=tmp_path)
    assert (patched / "train.ipynb").read_bytes() == (tmp_path / "train.ipynb").read_bytes()


def test_invalid_notebook_json_is_one_error_line(tmp_path):
    (tmp_path / "broken.ipynb").write_text('{"cells": [ {"cell_type": "code", ')
    (tmp_path / "ok.py").write_text("import torch\nx = torch.ones(1).cuda()\n")
    result = run_cli("apply", "--force", ".", cwd=tmp_path)
    assert result.returncode == 2
    assert "broken.ipynb: error: invalid notebook JSON at line 1" in result.stderr
    assert "Traceback" not in result.stderr
    assert ".npu()" in (tmp_path / "ok.py").read_text()


def test_notebook_with_a_broken_cell_is_reported_not_half_migrated(tmp_path):
    notebook = json.loads(NOTEBOOK.read_text())
    notebook["cells"][2]["source"].append("\nprint(x.cuda(")
    (tmp_path / "nb.ipynb").write_text(json.dumps(notebook, indent=1))
    result = run_cli("apply", "--force", "nb.ipynb", cwd=tmp_path)
    assert result.returncode == 2 and "nb.ipynb: error: code cells: syntax error" in result.stderr
    assert json.loads((tmp_path / "nb.ipynb").read_text()) == notebook


def test_launch_files_are_found_migrated_and_idempotent(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run.sh").write_text("export CUDA_VISIBLE_DEVICES=0,1\nnvidia-smi\npython train.py\n")
    (tmp_path / "Dockerfile").write_text("FROM base\nENV CUDA_LAUNCH_BLOCKING=1\n")
    (tmp_path / "launch.yaml").write_text("env:\n  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True\n")
    (tmp_path / "kernels.cu").write_text("__global__ void k(float* x) {}\n")
    result = run_cli("apply", "--force", ".", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        tmp_path / "scripts" / "run.sh"
    ).read_text() == "export ASCEND_RT_VISIBLE_DEVICES=0,1\nnpu-smi info\npython train.py\n"
    assert (tmp_path / "Dockerfile").read_text() == "FROM base\nENV ASCEND_LAUNCH_BLOCKING=1\n"
    assert (tmp_path / "launch.yaml").read_text() == "env:\n  PYTORCH_NPU_ALLOC_CONF: expandable_segments:True\n"
    assert (tmp_path / "kernels.cu").read_text() == "__global__ void k(float* x) {}\n", "kernels are never rewritten"
    assert "kernels.cu:1:1: NPU801 CUDA kernel `k` needs an Ascend C port" in result.stdout
    # The open NPU801 error is for a human: it fails --check only when asked to (--fail-on error).
    assert run_cli("apply", "--check", ".", cwd=tmp_path).returncode == 0
    assert run_cli("apply", "--check", "--fail-on", "error", ".", cwd=tmp_path).returncode == 1
    assert run_cli("apply", "--diff", ".", cwd=tmp_path).stdout == ""


def test_suppression_comment_in_a_shell_script(tmp_path):
    (tmp_path / "run.sh").write_text("export CUDA_VISIBLE_DEVICES=0  # npu-migrate: ignore\nnvidia-smi\n")
    assert run_cli("apply", "--force", "run.sh", cwd=tmp_path).returncode == 0
    assert (tmp_path / "run.sh").read_text() == "export CUDA_VISIBLE_DEVICES=0  # npu-migrate: ignore\nnpu-smi info\n"
