"""One import policy (issue 13, pattern 6): at most one `import torch_npu` per migrated file.

A file that calls torch.npu APIs imports torch_npu unconditionally (NPU001: it cannot run without it);
fused branches alone never require it (their helpers import it guarded, or use NPU001's import).
"""

from __future__ import annotations

from test_cli import run_cli

from npu_migrate.engine.pipeline import migrate_text

NORM = """import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
"""


def test_fused_branches_alone_import_torch_npu_guarded():
    text, _ = migrate_text(NORM)
    assert text.count("import torch_npu\n") == 1
    assert "try:\n    import torch_npu\nexcept ImportError:" in text


def test_a_file_calling_npu_apis_gets_one_unconditional_import_which_the_fused_helpers_use():
    text, _ = migrate_text(NORM + "\n\ndef place(x):\n    return x.cuda()\n")
    assert text.count("import torch_npu\n") == 1 and "except ImportError" not in text
    assert text.index("import torch_npu\n") < text.index("def _is_npu(")


def test_a_file_that_never_imports_torch_still_gets_the_import():
    text, findings = migrate_text("def move(batch):\n    return batch.cuda()\n")
    assert text == "import torch_npu\n\n\ndef move(batch):\n    return batch.npu()\n"
    assert {f.rule_id for f in findings if f.fixed} == {"NPU001", "NPU101"}


def test_selecting_a_family_that_needs_torch_npu_brings_the_import(tmp_path):
    (tmp_path / "train.py").write_text("import torch\n\nx = torch.ones(2).cuda()\n", encoding="utf-8")
    result = run_cli("apply", "--diff", "--select", "NPU1", "train.py", cwd=tmp_path)
    assert "+import torch_npu" in result.stdout, result.stdout + result.stderr
    ignored = run_cli("apply", "--diff", "--select", "NPU1", "--ignore", "NPU001", "train.py", cwd=tmp_path)
    assert "+x = torch.ones(2).npu()" in ignored.stdout and "import torch_npu" not in ignored.stdout
