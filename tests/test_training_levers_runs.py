"""Issue #24, training speed, run with torch: the fused optimizers' update and the `train_levers` project.

* The optimizer math: the simulated host's `torch_npu.optim` (`verify/npu_optim.py`, the fused classes'
  update on combined tensors, from their Python source) against `torch.optim` for a few steps, on the CPU:
  parameters equal to rtol 1e-6. A deliberately broken twin (AdamW's decay applied as L2) is caught.
* The fused classes' constraints, modelled as errors: a gradient set to None after the first step, a
  parameter re-allocated, `zero_grad(set_to_none=True)`, bf16 parameters.
* The project `fixtures/projects/train_levers`: on the CPU the original and the NPU411-migrated script train
  bit for bit alike (the helper builds torch.optim's class there); fully migrated on the simulated NPU host it
  builds `NpuFusedAdamW`, runs NPU511's start-up switches, and its losses and parameters match the CPU run to
  rtol 1e-6; with CPU parameters there it builds torch.optim's class; a wrong fused update is caught.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.verify import npu_optim

pytestmark = pytest.mark.integration  # needs torch: the `integration` extra


def _migrate(text: str, select=("NPU411",)) -> tuple[str, list]:
    return migrate_text(text, path="train.py", select=list(select))


PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "train_levers"


CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-2}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1}),
    ("Adam", {"lr": 1e-2}),
    ("Adam", {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}),
    ("AdamW", {"lr": 1e-2}),
    ("AdamW", {"lr": 1e-2, "betas": (0.8, 0.99), "weight_decay": 0.3, "amsgrad": True}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 1e-2}),
    ("RMSprop", {"lr": 1e-2, "momentum": 0.9, "centered": True, "weight_decay": 0.1}),
]


def _model(seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(dtype)


def _train(model, optimizer, steps: int = 5) -> list[torch.Tensor]:
    torch.manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(4, 6), torch.randn(4, 3)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def _compare(name: str, options: dict, fused_class=None) -> bool:
    reference, fused = _model(), _model()
    expected = _train(reference, getattr(torch.optim, name)(reference.parameters(), **options))
    cls = fused_class or npu_optim.CLASSES[f"NpuFused{name}"]
    # Two parameter groups, as training scripts build them: the combined tensors span both.
    weights = [p for n, p in fused.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in fused.named_parameters() if n.endswith("bias")]
    got = _train(fused, cls([{"params": weights}, {"params": biases}], **options))
    return all(torch.allclose(g, e, rtol=1e-6, atol=1e-7) for g, e in zip(got, expected))


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_the_fused_update_is_torch_optims(name, options):
    assert _compare(name, options)


def test_the_comparison_catches_a_wrong_update():
    class L2AdamW(npu_optim.NpuFusedAdamW):
        decoupled = False  # AdamW's decay applied to the gradient, as Adam does: a wrong port

    assert _compare("AdamW", {"lr": 1e-2}, npu_optim.NpuFusedAdamW)
    assert not _compare("AdamW", {"lr": 1e-2}, L2AdamW)
    assert not _compare("SGD", {"lr": 0.1, "momentum": 0.9}, lambda params, **o: npu_optim.NpuFusedSGD(params, lr=0.1))


def test_the_fused_constraints_are_errors_not_silent():
    model = _model()
    optimizer = npu_optim.NpuFusedAdamW(model.parameters())
    _train(model, optimizer, steps=1)
    with pytest.raises(ValueError, match="set_to_none"):
        optimizer.zero_grad(set_to_none=True)
    model.zero_grad()  # torch's default sets the gradients to None; the backward pass makes new ones
    torch.nn.functional.mse_loss(model(torch.randn(2, 6)), torch.randn(2, 3)).backward()
    with pytest.raises(RuntimeError, match="gradient was replaced"):
        optimizer.step()

    model = _model()
    optimizer = npu_optim.NpuFusedSGD(model.parameters(), lr=0.1)
    _train(model, optimizer, steps=1)
    model.double().float()  # re-allocates every parameter's storage
    torch.nn.functional.mse_loss(model(torch.randn(2, 6)), torch.randn(2, 3)).backward()
    with pytest.raises(RuntimeError, match="re-allocated|gradient was replaced"):
        optimizer.step()

    weight = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    weight.grad = torch.ones_like(weight)
    with pytest.raises(TypeError, match="float32 or float16"):
        npu_optim.NpuFusedAdam([weight]).step()


def test_the_helper_picks_the_class_by_the_parameters():
    source = "import torch\n\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    migrated, _ = _migrate(source)
    namespace: dict = {}
    exec(compile(migrated, "migrated", "exec"), namespace)
    assert type(namespace["opt"]) is torch.optim.AdamW
    helper = namespace["_npu_fused_optimizer"]
    weights = torch.nn.Parameter(torch.ones(3))
    assert type(helper(torch.optim.AdamW, [weights], lr=1e-3)) is torch.optim.AdamW  # a CPU parameter
    group = {"params": (p for p in [weights]), "weight_decay": 0.0}  # a generator, consumed once
    built = helper(torch.optim.SGD, [group], lr=0.1)
    assert type(built) is torch.optim.SGD and built.param_groups[0]["params"] == [weights]
    with pytest.raises(TypeError):  # torch.optim's own error for a bare tensor stays
        helper(torch.optim.SGD, weights, lr=0.1)


def _apply(project: Path, out: Path, select: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", str(project), "--output", str(out), "--select", select],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


_ON_NPU_HOST = (
    "from npu_migrate.verify import npu_host; npu_host.install()\n"
    "import runpy, sys; sys.argv[0] = 'train.py'; runpy.run_path('train.py', run_name='__main__')\n"
)


#: A wrong port the project comparison must catch: AdamW's decay applied to the gradient, as Adam does.
_BROKEN_FUSED = (
    "from npu_migrate.verify import npu_host, npu_optim; npu_host.install()\n"
    "class L2AdamW(npu_optim.NpuFusedAdamW):\n    decoupled = False\n"
    "import torch_npu; torch_npu.optim.NpuFusedAdamW = L2AdamW\n"
    "import runpy, sys; sys.argv[0] = 'train.py'; runpy.run_path('train.py', run_name='__main__')\n"
)


def _run(folder: Path, npu_host: bool = False, *args: str, code: str = _ON_NPU_HOST) -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    command = [sys.executable, "-c", code, *args] if npu_host else [sys.executable, "train.py", *args]
    proc = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _floats(values: list[str]) -> torch.Tensor:
    return torch.tensor([float.fromhex(v) for v in values], dtype=torch.float64)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("train_levers")
    original = base / "original"
    shutil.copytree(PROJECT, original)
    only_levers, full = base / "npu411", base / "full"
    _apply(original, only_levers, "NPU411")
    _apply(original, full, "ALL,NPU411,NPU511")
    return {
        "original": _run(original),
        "npu411_cpu": _run(only_levers),
        "npu_host": _run(full, True),
        "npu_host_cpu": _run(full, True, "--device", "cpu"),
        "npu_host_broken": _run(full, True, code=_BROKEN_FUSED),
        "migrated": (full / "train.py").read_text(encoding="utf-8"),
    }


def test_the_project_trains_alike_on_the_cpu_before_and_after(runs):
    assert runs["original"]["optimizer"] == runs["npu411_cpu"]["optimizer"] == "AdamW"
    assert runs["npu411_cpu"] == runs["original"]  # bit for bit: the helper built torch.optim.AdamW


def test_on_the_npu_host_cpu_parameters_get_the_original_class(runs):
    assert runs["npu_host_cpu"]["optimizer"] == "AdamW"  # torch_npu is there, the parameters are not on it
    assert runs["npu_host_cpu"] == runs["original"]


def test_the_project_builds_the_fused_optimizer_on_the_npu_host(runs):
    assert "_npu_fused_optimizer(torch.optim.AdamW, groups" in runs["migrated"]
    assert "torch.npu.set_compile_mode(jit_compile=False)" in runs["migrated"]  # NPU511 ran there too
    npu, cpu = runs["npu_host"], runs["original"]
    assert npu["device"] == "npu" and npu["optimizer"] == "NpuFusedAdamW"
    for key in ("losses", "params"):
        assert torch.allclose(_floats(npu[key]), _floats(cpu[key]), rtol=1e-6, atol=0), key
    # The same comparison catches a wrong fused update.
    broken = runs["npu_host_broken"]
    assert broken["optimizer"] == "L2AdamW"
    assert not torch.allclose(_floats(broken["params"]), _floats(cpu["params"]), rtol=1e-6, atol=0)
