"""On an NVIDIA GPU: migrated fused-op code still runs on CUDA, and computes the original's numbers.

The fused branches are meant to be inert off an NPU: `_is_npu(x)` is False for CUDA tensors, so a migrated
model must take its original body, on the GPU too, eagerly and under every graph mode the original survives
(TorchScript with a save/load round trip, FX, and `torch.compile` with its real CUDA backend, inductor, which
the CPU tests cannot exercise). Eager, TorchScript and FX must give the original's bits; inductor compiles
two different Python functions (the migrated one has a dead branch), so it is held to float tolerance and the
test says whether the bits matched.

These checks need a visible GPU and a CUDA build of torch, so they run only where there is one (the project's
lent GPU machine: `python -m pytest -q tests/test_fused_cuda.py`); on a CPU build they skip with that reason.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES
from test_fused_graph_modes import CASES, MODES, _load

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a visible NVIDIA GPU and CUDA torch"),
]

RULES = FIXTURES / "rules"
PROJECT = FIXTURES / "projects" / "qwen_like"


def _inductor(fn, inputs):
    torch._dynamo.reset()
    return torch.compile(fn)(*inputs)  # the default backend: inductor, Triton kernels on CUDA


def _eager(fn, inputs):
    return fn(*inputs)


CUDA_MODES = {"eager": _eager, **{k: v for k, v in MODES.items() if k != "compile(eager)"}, "compile": _inductor}


def _to_cuda(value):
    if isinstance(value, torch.Tensor | torch.nn.Module):
        return value.cuda()
    return value


def _attempt(mode, fn, inputs):
    try:
        with torch.no_grad():
            return CUDA_MODES[mode](fn, inputs), None
    except Exception as exc:  # noqa: BLE001 - which modes the original survives on CUDA is what is measured
        return None, exc


def _same(got, expected, mode, label):
    if mode != "compile":
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        return
    torch.testing.assert_close(got, expected)
    flat = [
        torch.equal(a, b)
        for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected))
    ]
    print(f"{label} compile(inductor): bits {'equal' if all(flat) else 'within float tolerance'}")


@pytest.mark.parametrize("mode", list(CUDA_MODES))
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_migrated_fixture_runs_on_cuda_as_the_original(case, mode):
    rule, name, build, inputs = case
    original = _to_cuda(build(_load(RULES / rule / f"{name}.in.py", None)))
    migrated = build(_load(RULES / rule / f"{name}.out.py", None))
    if isinstance(original, torch.nn.Module):
        migrated.load_state_dict(original.state_dict())
    migrated = _to_cuda(migrated)
    args = tuple(_to_cuda(a) for a in inputs())
    expected, failure = _attempt(mode, original, args)
    if failure is not None:
        pytest.skip(f"the original itself fails under {mode} on CUDA: {failure!r}"[:300])
    got, failure = _attempt(mode, migrated, args)
    assert failure is None, f"{name} runs under {mode} on CUDA before migration, not after: {failure!r}"
    _same(got, expected, mode, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_qwen_like_migrated_with_apply_runs_on_cuda_as_the_original(tmp_path, monkeypatch, dtype):
    result = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", str(PROJECT), "--output", str(tmp_path / "migrated")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    monkeypatch.syspath_prepend(str(tmp_path / "migrated"))
    for name in [m for m in sys.modules if m == "qwen_like" or m.startswith("qwen_like.")]:
        monkeypatch.delitem(sys.modules, name)
    migrated = importlib.import_module("qwen_like.modeling")
    assert migrated.__file__.startswith(str(tmp_path))
    original = {"__name__": "qwen_like_original"}
    source = PROJECT / "qwen_like" / "modeling.py"
    exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), original)

    def run(block_class, x, mode):
        torch.manual_seed(0)
        block = block_class().to("cuda", dtype)
        with torch.no_grad():
            for p in block.parameters():  # large, perturbed weights: default init hides wrong rewrites
                p.add_(torch.randn_like(p) * 0.5)
        tables = tuple(t.cuda() for t in original["rotary_tables"](5, 8))
        return _attempt(mode, block, (x, tables))

    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(2)).to("cuda", dtype)
    for mode in ("eager", "compile"):
        expected, failure = run(original["QBlock"], x, mode)
        assert failure is None, f"original under {mode}: {failure!r}"
        got, failure = run(migrated.QBlock, x, mode)
        assert failure is None, f"migrated under {mode}: {failure!r}"
        assert got.device.type == "cuda"
        _same(got, expected, mode, f"qwen_like {dtype}")
