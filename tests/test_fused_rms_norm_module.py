"""Issue #14: NPU706, `nn.RMSNorm` constructions built as `_NpuRMSNorm`, executed.

The migrated fixture runs with `_is_npu` forced true and the CPU reference kernels of
`npu_migrate.verify.reference` as `torch_npu`, against the original: fp32 cosine >= 0.999, bf16 >= 0.99,
the kernel called for the norms it can compute (an explicit eps; without a weight, a gamma of ones) and
not for the others. With
`_is_npu` false it computes the original's bits; the checkpoint keys and `isinstance` are unchanged; and it
survives TorchScript, FX and torch.compile as the original does. A broken branch (the weight dropped)
fails the comparison.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES

from npu_migrate.verify import reference

pytestmark = pytest.mark.integration  # needs torch: the `integration` extra

CASES = FIXTURES / "rules" / "NPU706"
TORCH_NPU = reference.torch_npu_module()


def _module(kind: str, folder, *, npu: bool = False, torch_npu=None, mutate=()):
    """modules.<kind>.py imported from a file (TorchScript reads the source)."""
    text = (CASES / f"modules.{kind}.py").read_text(encoding="utf-8")
    for old, new in mutate:
        assert old in text, f"mutant {old!r} does not apply"
        text = text.replace(old, new)
    path = folder / f"modules_{kind}_{len(list(folder.iterdir()))}.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"_npu706_{path.stem}_{id(folder)}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if hasattr(module, "_is_npu"):
        module.torch_npu = TORCH_NPU if npu else torch_npu
        if npu:
            module._is_npu = lambda x: True
    return module


def _blocks(folder, dtype, **migrated):
    torch.manual_seed(0)
    original = _module("in", folder).Block(16, 4)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for parameter in original.parameters():  # weights far from one: a dropped weight shows
            parameter.copy_(1 + 0.8 * torch.randn(parameter.shape, generator=generator))
    block = _module("out", folder, **migrated).Block(16, 4)
    block.load_state_dict(original.state_dict(), strict=True)
    x = (3 * torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))).to(dtype)
    return original.to(dtype), block.to(dtype), x


def _cosine(a, b) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


@pytest.mark.parametrize(("dtype", "least"), [(torch.float32, 0.999), (torch.bfloat16, 0.99)], ids=["fp32", "bf16"])
def test_the_npu_path_computes_what_rms_norm_does(dtype, least, tmp_path):
    original, migrated, x = _blocks(tmp_path, dtype, npu=True)
    before = TORCH_NPU.calls["npu_rms_norm"]
    got = migrated(x)
    # The norms with an explicit eps (over the last dim, the last two, and one without a weight: a gamma of
    # ones); not the one with eps=None.
    assert TORCH_NPU.calls["npu_rms_norm"] == before + 3
    assert got.dtype == dtype and _cosine(got, original(x)) >= least


def test_a_broken_branch_fails_the_comparison(tmp_path):
    dropped = ("_npu_rms_norm(x, weight, eps)", "_npu_rms_norm(x, torch.ones_like(weight), eps)")
    original, migrated, x = _blocks(tmp_path, torch.float32, npu=True, mutate=[dropped])
    assert _cosine(migrated(x), original(x)) < 0.999


def test_off_the_npu_it_is_rms_norm_bit_for_bit(tmp_path):
    original, migrated, x = _blocks(tmp_path, torch.float32, torch_npu=types.ModuleType("torch_npu"))
    assert torch.equal(migrated(x), original(x))
    assert all(isinstance(m, torch.nn.RMSNorm) for m in (migrated.input_norm, migrated.per_head))
    assert list(migrated.state_dict()) == list(original.state_dict())


def _graph(mode, module, x):
    if mode == "jit.script":
        return torch.jit.script(module)(x)
    if mode == "fx.symbolic_trace":
        return torch.fx.symbolic_trace(module)(x)
    torch._dynamo.reset()
    return torch.compile(module, backend="eager")(x)


@pytest.mark.parametrize("torch_npu", ["absent", "dummy"])
@pytest.mark.parametrize("mode", ["jit.script", "fx.symbolic_trace", "compile(eager)"])
def test_it_survives_every_graph_mode(mode, torch_npu, tmp_path):
    stand_in = types.ModuleType("torch_npu") if torch_npu == "dummy" else None
    original, migrated, x = _blocks(tmp_path, torch.float32, torch_npu=stand_in)
    with torch.no_grad():
        torch.testing.assert_close(_graph(mode, migrated, x), _graph(mode, original, x), rtol=0, atol=0)
