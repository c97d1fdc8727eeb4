"""Issue #3 end to end: a multi-file DDP + AMP training project migrated with every rule selected.

`fixtures/projects/ddp_amp/` is our own small project: `utils/dist.py` sets up the process group from a
dataclass whose backend default is a module constant, `train.py` takes the backend from argparse and
uses `torch.cuda.amp`, and `model.py` has `custom_fwd` / `custom_bwd` decorators.
"""

from __future__ import annotations

import ast
import re

import pytest
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text

PROJECT = FIXTURES / "projects" / "ddp_amp"
FILES = ("train.py", "model.py", "utils/dist.py")

EXPECTED_LINES = {
    "train.py": [
        "import torch_npu",
        "from torch.amp import GradScaler, autocast",
        'parser.add_argument("--backend", default="hccl", choices=["hccl", "gloo"])',
        'device = torch.device(f"npu:{local_rank}")',
        'model = DDP(model, device_ids=[f"npu:{local_rank}"], output_device=local_rank)',
        'scaler = GradScaler("npu", enabled=args.amp_dtype == "float16")',
        "batch = torch.randn(8, 16, 64).npu(non_blocking=True)",
        'with autocast("npu", dtype=dtype):',
        "torch.npu.max_memory_allocated()",
    ],
    "model.py": [
        "import torch_npu",
        "from torch.amp import custom_bwd, custom_fwd",
        '@custom_fwd(cast_inputs=torch.float16, device_type="npu")',
        '@custom_bwd(device_type="npu")',
        'def __init__(self, dim: int, device: str = "npu"):',
    ],
    "utils/dist.py": [
        "import torch_npu",
        'DEFAULT_BACKEND = "hccl"',
        'os.environ.setdefault("TORCH_HCCL_ASYNC_ERROR_HANDLING", "1")',
        'if "ASCEND_RT_VISIBLE_DEVICES" not in os.environ:',
        'os.environ["ASCEND_RT_VISIBLE_DEVICES"] = str(local_rank)',
        "torch.npu.set_device(local_rank)",
        'dist.init_process_group(backend=config.backend, device_id=torch.device("npu", local_rank))',
        'if dist.get_backend() == "hccl" and dist.is_hccl_available():',
    ],
}

#: Strings that select CUDA or NCCL when they reach torch.
CUDA_VALUE = re.compile(r"nccl|cuda(:\d+)?|cpu:gloo,cuda:nccl")
TEXT_KEYWORDS = frozenset({"help", "description"})


@pytest.fixture(scope="module")
def migrated() -> dict[str, tuple[str, str, list]]:
    result = {}
    for name in FILES:
        source = (PROJECT / name).read_text(encoding="utf-8")
        text, findings = migrate_text(source, path=name)
        result[name] = (source, text, findings)
    return result


@pytest.mark.parametrize("name", FILES)
def test_expected_npu_lines(migrated, name):
    source, text, _ = migrated[name]
    assert text != source
    lines = {line.strip() for line in text.splitlines()}
    for expected in EXPECTED_LINES[name]:
        assert expected in lines or any(expected in line for line in lines), f"{name}: missing {expected!r}"


@pytest.mark.parametrize("name", FILES)
def test_migrated_file_parses_and_is_idempotent(migrated, name):
    _, text, _ = migrated[name]
    ast.parse(text, filename=name)
    again, findings = migrate_text(text, path=name)
    assert again == text
    assert not [f for f in findings if f.fixed], "a second run must find nothing left to fix"


def _text_only(tree: ast.Module) -> set[int]:
    """Nodes that are prose, not values reaching torch: docstrings, print() arguments, help texts."""
    skipped: set[int] = set()

    def skip(node: ast.AST) -> None:
        skipped.update(id(child) for child in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node) is not None:
            skip(node.body[0])
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "print":
                skip(node)
            for keyword in node.keywords:
                if keyword.arg in TEXT_KEYWORDS:
                    skip(keyword.value)
    return skipped


@pytest.mark.parametrize("name", FILES)
def test_no_cuda_or_nccl_value_reaches_torch(migrated, name):
    _, text, _ = migrated[name]
    tree = ast.parse(text)
    prose = _text_only(tree)
    left = []
    for node in ast.walk(tree):
        if id(node) in prose:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CUDA_VALUE.fullmatch(node.value):
            left.append((node.lineno, node.value))
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            if str(node.values[0].value).startswith("cuda:"):
                left.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Attribute) and node.attr in ("cuda", "NCCL", "is_nccl_available"):
            left.append((node.lineno, ast.unparse(node)))
    assert not left, f"{name}: CUDA/NCCL values left: {left}"


def test_project_source_is_really_cuda_code():
    """The check above could pass vacuously; the unmigrated project must fail it."""
    source = (PROJECT / "utils/dist.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    prose = _text_only(tree)
    values = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in prose]
    assert "nccl" in values and "cuda" in values


def test_only_open_findings_are_expected(migrated):
    # The project is fully migratable: nothing may be left for the user to fix by hand. A training lever's
    # advice (NPU107: a per-step `loss.item()`) is a speed hint, not a fix.
    from npu_migrate.engine.registry import rule

    open_findings = [
        (name, f.line, f.rule_id, f.message)
        for name, (_, _, fs) in migrated.items()
        for f in fs
        if not f.fixed and not ("lever" in rule(f.rule_id).tags and not rule(f.rule_id).fixable)
    ]
    assert open_findings == []


def test_older_torch_npu_keeps_cuda_amp_signature_through_torch_npu_amp():
    # torch_npu 2.1 is built for torch 2.1, which has neither torch.amp.GradScaler nor torch.amp.custom_fwd.
    source = (PROJECT / "train.py").read_text(encoding="utf-8")
    text, _ = migrate_text(source, path="train.py", torch_npu_version="2.1.0.post8")
    assert "from torch.amp import autocast" in text
    assert "from torch_npu.npu.amp import GradScaler" in text
    assert "scaler = GradScaler(enabled=" in text
    assert 'with autocast("npu", dtype=dtype):' in text
    model, _ = migrate_text(
        (PROJECT / "model.py").read_text(encoding="utf-8"), path="model.py", torch_npu_version="2.1.0.post8"
    )
    assert "from torch_npu.npu.amp import custom_bwd, custom_fwd" in model
    assert "@custom_fwd(cast_inputs=torch.float16)" in model


def test_launch_script_config_and_notebook_migrate_too(tmp_path):
    """The project's other file kinds: the launcher, the YAML config and the notebook."""
    import json
    import shutil

    from test_cli import run_cli

    shutil.copytree(PROJECT, tmp_path / "project")
    result = run_cli("apply", "--force", "project", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    launch = (tmp_path / "project" / "launch.sh").read_text()
    for line in (
        "export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3",
        "export TORCH_HCCL_ASYNC_ERROR_HANDLING=1",
        "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True",
        "npu-smi info",
        "torchrun --nproc_per_node=4 train.py --backend hccl --amp-dtype bfloat16",
        "# Launch on every GPU of this node (nvidia-smi lists them).",  # comments stay
    ):
        assert line in launch.splitlines()
    config = (tmp_path / "project" / "config.yaml").read_text()
    for line in (
        '  ASCEND_RT_VISIBLE_DEVICES: "0,1,2,3"',
        "  HCCL_SOCKET_IFNAME: eth0",
        '  ASCEND_LAUNCH_BLOCKING: "0"',
    ):
        assert line in config.splitlines()
    notebook = json.loads((tmp_path / "project" / "explore.ipynb").read_text())
    code = "".join(notebook["cells"][2]["source"])
    for line in (
        'state = torch.load("ckpt.pt", map_location="npu:0")',
        "block = Block(64).npu()",
        'with torch.autocast(device_type="npu", dtype=torch.bfloat16):',
        '    out = block(torch.randn(2, 8, 64, device="npu"))',
    ):
        assert line in code.splitlines()
    assert notebook["cells"][2]["outputs"] == [{"name": "stdout", "output_type": "stream", "text": ["loaded\n"]}]
    for migrated_py in (tmp_path / "project").rglob("*.py"):
        compile(migrated_py.read_text(), str(migrated_py), "exec")
    assert run_cli("apply", "--diff", "project", cwd=tmp_path).stdout == ""
