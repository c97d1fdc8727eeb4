"""verify on any host (issue #25): the migrated tree's own `import torch_npu` works without torch_npu, the
stand-in's classes behave as types, and a missing torch is named with the command that installs it."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import VerifyUsageError, compare, smoke
from npu_migrate.verify.harness import imports_torch_npu

pytestmark = pytest.mark.integration  # needs torch: the `integration` extra

MODEL = textwrap.dedent(
    """\
    import torch
    from torch import nn

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim) + 0.5 * torch.randn(dim))
            self.eps = eps

        def forward(self, x):
            variance = x.pow(2).mean(-1, keepdim=True)
            x = x * torch.rsqrt(variance + self.eps)
            return self.weight * x


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.norm = RMSNorm(16)

        def forward(self, x):
            return self.norm(self.lin(x))
    """
)
FACTORY = "import torch\nfrom pkg.model import Net\n\n\ndef build():\n    return Net(), torch.randn(2, 4, 16)\n"


@pytest.fixture
def trees(tmp_path):
    for side in ("original", "migrated"):
        (tmp_path / side / "pkg").mkdir(parents=True)
        (tmp_path / side / "pkg" / "__init__.py").write_text("")
    (tmp_path / "original" / "pkg" / "model.py").write_text(MODEL)
    migrated, _ = migrate_text(MODEL, path="model.py")
    (tmp_path / "migrated" / "pkg" / "model.py").write_text(migrated)
    (tmp_path / "factory.py").write_text(FACTORY)
    return tmp_path


def test_a_migrated_tree_that_imports_torch_npu_verifies_without_it(trees):
    assert importlib.util.find_spec("torch_npu") is None, "this test is about a host without torch_npu"
    migrated = (trees / "migrated" / "pkg" / "model.py").read_text()
    assert "\nimport torch_npu\n" in migrated, "apply imports torch_npu at module level beside the device rewrite"
    assert imports_torch_npu(trees / "migrated") and not imports_torch_npu(trees / "original")
    # Before: "the migrated code fails where the original runs (import): ... No module named 'torch_npu'".
    report = compare(trees / "original", trees / "migrated", trees / "factory.py")
    assert report.passed, report.to_text(verbose=True)
    assert report.fused_calls == {"npu_rms_norm": 1}
    assert any("simulated NPU host" in w for w in report.warnings)


def test_the_stand_in_still_catches_a_broken_rewrite(trees):
    path = trees / "migrated" / "pkg" / "model.py"
    text = path.read_text()
    broken = text.replace("self.weight", "(self.weight * 2)", 1)
    assert broken != text
    path.write_text(broken)
    report = compare(trees / "original", trees / "migrated", trees / "factory.py")
    assert not report.passed, report.to_text()


def test_smoke_annotations_of_torch_npu_classes(tmp_path):
    (tmp_path / "graphs.py").write_text(
        textwrap.dedent(
            """\
            import torch
            import torch_npu


            class Runner:
                graph: torch.npu.NPUGraph | None = None


            def capture(graph: torch.npu.NPUGraph | None = None) -> torch.npu.NPUGraph | None:
                return graph


            assert capture() is None and not isinstance(object(), torch.npu.NPUGraph)
            """
        )
    )
    # Before: TypeError: unsupported operand type(s) for |: 'Unmodelled' and 'NoneType', in the host itself.
    report = smoke.run(tmp_path, script=tmp_path / "graphs.py")
    assert report.passed, report.to_text(verbose=True)
    (tmp_path / "make.py").write_text("import torch\nimport torch_npu\n\ntorch.npu.NPUGraph()\n")
    made = smoke.run(tmp_path, script=tmp_path / "make.py")
    assert not made.passed and "NPUGraph is not modelled" in made.to_text()


def test_without_torch_verify_says_what_to_install(trees, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(VerifyUsageError, match=r"needs torch, which is not installed here: pip install"):
        compare(trees / "original", trees / "migrated", trees / "factory.py")
    with pytest.raises(smoke.SmokeUsageError, match=r"needs torch, which is not installed here: pip install"):
        smoke.run(trees / "migrated", module="pkg.model")
