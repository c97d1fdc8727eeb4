"""Confirmed review defects outside the fused rules: each test here failed before its fix."""

from __future__ import annotations

from test_cli import run_cli

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
