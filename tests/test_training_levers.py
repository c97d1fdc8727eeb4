"""Issue #24, training speed: the levers' rules (NPU411, NPU412, NPU421, NPU422) and `analyze`'s listing.

The rules' rewrites and declines, and `training_levers.csv` (applied / available / declined / advice). The
optimizer math and the project runs, which need torch, are in `test_training_levers_runs.py`.
"""

from __future__ import annotations

import csv

import pytest

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.engine.registry import select_rules


def _migrate(text: str, select=("NPU411",), version: str | None = None) -> tuple[str, list]:
    kwargs = {"torch_npu_version": version} if version else {}
    return migrate_text(text, path="train.py", select=list(select), **kwargs)


def test_all_does_not_select_the_opt_in_rule_an_id_does():
    assert "NPU411" not in select_rules(["ALL"])
    assert "NPU412" in select_rules(["ALL"])
    assert "NPU411" in select_rules(["ALL", "NPU411"])
    # a prefix selects a family's default rules, never an opt-in one: that takes its exact id
    assert "NPU411" not in select_rules(["NPU4"]) and "NPU412" in select_rules(["NPU4"])


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("opt = torch.optim.AdamW(model.parameters(), maximize=True)", "`maximize` has no counterpart"),
        ("opt = torch.optim.AdamW(model.parameters(), fused=True)", "_fused_adamw_"),
        ("opt = torch.optim.SGD(model.parameters())", "no default learning rate"),
        ("opt = torch.optim.Adam(*args)", "`*args`"),
    ],
)
def test_declined_with_the_reason(line, reason):
    source = f"import torch\n\nmodel = torch.nn.Linear(2, 2)\n{line}\n"
    migrated, findings = _migrate(source)
    assert migrated == source
    assert any(f.rule_id == "NPU411" and reason in f.message and not f.fixed for f in findings), findings


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("model.zero_grad()", "sets the gradients to None"),
        ("opt.zero_grad(set_to_none=True)", "raises ValueError"),
        ("model.cpu()", "re-allocates the parameters"),
        ("model.half()", "re-allocates the parameters"),
        ("p.grad = None", "re-allocates a parameter or gradient"),
        ("import deepspeed", "DeepSpeed"),
    ],
)
def test_declined_where_the_file_breaks_the_constraint(code, reason):
    source = f"import torch\n\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.AdamW(model.parameters())\n{code}\n"
    migrated, findings = _migrate(source)
    assert migrated == source
    assert any(reason in f.message for f in findings if f.rule_id == "NPU411"), findings


def test_moves_before_the_optimizer_and_the_optimizers_zero_grad_are_fine():
    source = (
        "import torch\n\nmodel = torch.nn.Linear(2, 2).to('npu')\nmodel.half()\n"
        "opt = torch.optim.AdamW(model.parameters())\nopt.zero_grad()\nmodel.zero_grad(set_to_none=False)\n"
    )
    migrated, findings = _migrate(source)
    assert "_npu_fused_optimizer(torch.optim.AdamW, model.parameters())" in migrated
    assert [f.fixed for f in findings if f.rule_id == "NPU411"] == [True]


@pytest.mark.parametrize(("version", "reported"), [("2.5.1.post1", True), ("2.8.0.post5", True), ("2.13.0", False)])
def test_native_fused_adam_is_reported_where_torch_npu_lacks_the_kernel(version, reported):
    source = "import torch\n\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.Adam(model.parameters(), fused=True)\n"
    migrated, findings = _migrate(source, select=("NPU412",), version=version)
    assert migrated == source
    warnings = [f for f in findings if f.rule_id == "NPU412" and f.severity.value == "warning"]
    assert bool(warnings) is reported and len([f for f in findings if f.rule_id == "NPU412"]) == 1


LEVER_PROJECT = {
    "train.py": (
        "import torch\n\n"
        "model = torch.nn.Linear(4, 2).cuda()\n"
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
        "maximizing = torch.optim.Adam(model.parameters(), maximize=True)\n"
        "for x in range(3):\n"
        "    loss = model(torch.ones(4).cuda()).sum()\n"
        "    loss.backward()\n"
        "    print(loss.item())\n"
    ),
    "run.sh": "export MASTER_PORT=29500\ntorchrun --nproc_per_node 8 train.py\n",
}


def _levers(tmp_path, *options) -> list[tuple[str, str, str]]:
    from typer.testing import CliRunner

    from npu_migrate.cli.app import app

    project, out = tmp_path / "project", tmp_path / "out"
    project.mkdir(parents=True)
    for name, text in LEVER_PROJECT.items():
        (project / name).write_text(text, encoding="utf-8")
    args = ["analyze", str(project), "--mode", "affinity_apis", "--output", str(out), *options]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output

    with open(out / "training_levers.csv", encoding="utf-8", newline="") as handle:
        return [(row["location"], row["rule"], row["status"]) for row in csv.DictReader(handle)]


def test_analyze_lists_each_lever_as_applied_available_declined_or_advice(tmp_path):
    rows = _levers(tmp_path)
    assert ("train.py:4:1", "NPU411", "available") in rows  # opt-in, not selected: available
    assert ("train.py:5:14", "NPU411", "declined") in rows  # `maximize` has no counterpart
    assert ("train.py:9:11", "NPU107", "advice") in rows
    assert ("run.sh:2:1", "NPU606", "available") in rows
    selected = _levers(tmp_path / "selected", "--select", "ALL,NPU411")
    assert ("train.py:4:1", "NPU411", "applied") in selected  # what `apply --select ALL,NPU411` rewrites
    ignored = _levers(tmp_path / "ignored", "--ignore", "NPU411")
    assert not [row for row in ignored if row[1] == "NPU411"]


def test_parameters_built_in_init_are_fine_replaced_later_are_not():
    model_code = (
        "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.w = nn.Parameter(torch.ones(2))\n        self.w.data = torch.zeros(2)\n\n\n"
        "model = Net()\nopt = torch.optim.AdamW(model.parameters())\n"
    )
    migrated, _ = _migrate(model_code)
    assert "_npu_fused_optimizer(torch.optim.AdamW" in migrated
    replaced = model_code + "model.w = nn.Parameter(torch.ones(2))\n"
    migrated, findings = _migrate(replaced)
    assert migrated == replaced
    assert any("`model.w = ...` re-allocates" in f.message for f in findings), findings


def test_apex_required_only_on_cuda_keeps_its_guard():
    source = (
        "import torch\n\nmodel = torch.nn.Linear(2, 2)\nif torch.cuda.is_available():\n"
        "    from apex.optimizers import FusedAdam\n\n    optimizer = FusedAdam(model.parameters(), lr=1e-3)\n"
        "else:\n    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
    )
    migrated, findings = migrate_text(source, path="train.py")
    assert migrated == source  # the guard is not flipped: on an NPU host the AdamW branch runs
    assert {"NPU201", "NPU422"} <= {f.rule_id for f in findings}
