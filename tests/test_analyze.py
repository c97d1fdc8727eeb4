"""Issue #6: `npu-migrate analyze`, every mode on our own project `fixtures/projects/analyze_demo/`.

The project has a CUDA extension (setup.py, kernels/*.cu, a C++ binding), JIT builds (`load`,
`load_inline`), flash_attn and apex imports, DDP + AMP training, a Llama-style model (RMSNorm, SwiGLU,
rotary, SDPA, QuickGELU), a dataloader with a padding collate and syncs in the loop, dynamic-shape ops,
and a vendored library `site-packages/minilib` (skipped by discovery, analysed with --env-path) whose
functions reach `torch.cuda.jiterator`, `list_gpu_processes` and a custom operator.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import ROOT

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.engine.registry import all_rules

PROJECT = ROOT / "fixtures" / "projects" / "analyze_demo"
LIBRARY = PROJECT / "site-packages"
SCHEMA = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"


def run_analyze(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "npu_migrate.analyze.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=300,
    )


#: Run from the repository root, analyze names the project's files as `apply` does from there (issue #25):
#: `fixtures/projects/analyze_demo/demo/train.py`. The assertions name them from the project.
SHOWN_FROM_ROOT = PROJECT.relative_to(ROOT).as_posix() + "/"


def read_csv(path: Path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [[cell.replace(SHOWN_FROM_ROOT, "") for cell in row] for row in csv.reader(handle)]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    result = run_analyze(PROJECT, "--mode", "all", "--env-path", LIBRARY, "--output", out)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return out


@pytest.fixture(scope="module")
def document(reports) -> dict:
    return json.loads((reports / "report.json").read_text(encoding="utf-8"))


def rows(reports: Path, name: str) -> list[list[str]]:
    return read_csv(reports / name)[1:]


#: The analysis-only findings (NPU9xx). The rule findings are pinned against `migrate_text` below, so
#: this file follows the fused-operator rules as their authors extend them.
EXPECTED_ANALYSIS = [
    "demo/data.py:21:1 NPU932",
    "demo/data.py:28:12 NPU942",
    "demo/model.py:10:5 NPU901",
    "demo/model.py:42:66 NPU951",
    "demo/model.py:67:19 NPU921",  # SDPA: dropped once a fused rule injects npu_fusion_attention itself
    "demo/model.py:85:16 NPU921",
    "demo/model.py:112:9 NPU932",
    "demo/model.py:122:32 NPU931",
    "demo/model.py:122:46 NPU931",
    "demo/ops.py:11:1 NPU911",
    "demo/ops.py:41:12 NPU952",
    "demo/train.py:7:1 NPU901",
    "demo/train.py:29:12 NPU902",
    "demo/train.py:40:17 NPU931",
    "demo/train.py:41:36 NPU941",
    "demo/train.py:42:9 NPU941",
    "demo/train.py:43:13 NPU902",
    "kernels/bias_act.cpp:2:1 NPU911",
]
SDPA = "demo/model.py:67:19"


def sdpa_is_a_rule() -> bool:
    from npu_migrate.analyze.modes.affinity_apis import fused_rule_targets

    return "torch_npu.npu_fusion_attention" in fused_rule_targets().values()


def expected_analysis() -> list[str]:
    return [e for e in EXPECTED_ANALYSIS if not (e.startswith(SDPA) and sdpa_is_a_rule())]


def engine_findings() -> list:
    """What `apply --diff` reports for each file of the project: the rule half of the report."""
    from npu_migrate.engine.pipeline import Job, Mode, Plan, process
    from npu_migrate.engine.registry import select_rules
    from npu_migrate.files.kinds import kind_of

    plan = Plan(select_rules(), None, Mode.DIFF)
    found = []
    for path in sorted(PROJECT.rglob("*")):
        display = path.relative_to(PROJECT).as_posix()
        if kind_of(path) is not None and not display.startswith("site-packages/"):
            found.extend(process(Job(path, display), plan).findings)
    return found


def test_every_finding_of_mode_all(document):
    got = [f"{f['location']} {f['rule']}" for f in document["findings"] if f["rule"].startswith("NPU9")]
    assert got == expected_analysis()
    assert len(document["findings"]) == len(got) + len(engine_findings())


def test_rule_findings_are_exactly_what_apply_reports(document):
    """One mechanism: the rule findings of the report are those of `apply --diff`, message for message."""
    engine = {r.id for r in all_rules() if "analysis" not in r.tags}
    got = [
        (f["path"], f["rule"], f["line"], f["col"], f["message"], f["fixed"])
        for f in document["findings"]
        if f["rule"] in engine
    ]
    expected = [(f.path, f.rule_id, f.line, f.col, f.message, f.fixed) for f in engine_findings()]
    assert sorted(got) == sorted(expected)
    # and the same as migrate_text, the in-memory API, for a Python file
    _, in_memory = migrate_text((PROJECT / "demo" / "train.py").read_text(encoding="utf-8"), path="demo/train.py")
    assert [g[1:] for g in got if g[0] == "demo/train.py"] == [
        (f.rule_id, f.line, f.col, f.message, f.fixed) for f in in_memory
    ]


def test_every_finding_names_a_documented_rule(document):
    documented = {r.id: r for r in all_rules()}
    for f in document["findings"]:
        assert f["rule"] in documented
        assert "Example" in documented[f["rule"]].documentation or "Before" in documented[f["rule"]].documentation


# --- torch_apis ------------------------------------------------------------------------------------


def test_unsupported_and_unknown_api_csvs(reports):
    unsupported = rows(reports, "unsupported_api.csv")
    assert [r[:3] for r in unsupported] == [["demo/train.py:30:8", "torch.cuda.get_device_properties", "2.14.0"]]
    assert unsupported[0][3].startswith("NPU204: ")
    assert [r[:2] for r in rows(reports, "unknown_api.csv")] == [
        ["demo/ops.py:26:21", "torch.utils.cpp_extension.load"],
        ["demo/ops.py:35:12", "torch.utils.cpp_extension.load_inline"],
        ["setup.py:10:9", "torch.utils.cpp_extension.CUDAExtension"],
        ["setup.py:16:28", "torch.utils.cpp_extension.BuildExtension"],
    ]


def test_cuda_op_list(reports):
    assert [r[:4] for r in rows(reports, "cuda_op_list.csv")] == [
        ["demo/ops.py:39:8", "Tensor.is_cuda", "supported", "Tensor.is_npu"],
        ["demo/train.py:19:5", "torch.cuda.set_device", "supported", "torch.npu.set_device"],
        ["demo/train.py:28:14", "torch.cuda.amp.GradScaler", "supported", "torch.amp.GradScaler (device_type='npu')"],
        ["demo/train.py:30:8", "torch.cuda.get_device_properties", "unsupported", "torch.npu.get_device_properties"],
        [
            "demo/train.py:31:9",
            "torch.backends.cuda.matmul.allow_tf32",
            "supported",
            "torch.npu.matmul.allow_hf32",
        ],  # the tables do not cover it; rule NPU501 rewrites it
        ["demo/train.py:33:26", "Tensor.cuda", "supported", "Tensor.npu"],
        ["demo/train.py:33:58", "Tensor.cuda", "supported", "Tensor.npu"],
        ["demo/train.py:34:14", "torch.cuda.amp.autocast", "supported", "torch.amp.autocast (device_type='npu')"],
        ["demo/train.py:42:9", "torch.cuda.synchronize", "supported", "torch.npu.synchronize"],
    ]


def test_precision_and_performance_advice(reports):
    assert [r[:2] for r in rows(reports, "api_precision_advice.csv")] == [
        ["demo/train.py:30:8", "NPU204"],
        ["demo/model.py:42:66", "NPU951"],
        ["demo/ops.py:41:12", "NPU952"],
    ]
    from npu_migrate.analyze.modes.affinity_apis import is_fused_site

    performance = [f"{r[0]} {r[1]}" for r in rows(reports, "api_performance_advice.csv")]
    assert [p for p in performance if not p.split()[1].startswith("NPU7")] == [
        p for p in expected_analysis() if p.split()[1] in ("NPU921", "NPU931", "NPU941", "NPU942")
    ]
    assert [p for p in performance if p.split()[1].startswith("NPU7")] == [
        f"{f.location()} {f.rule_id}"
        for f in sorted(engine_findings(), key=lambda f: (f.path, f.line, f.col))
        if is_fused_site(f)
    ]


def test_verdicts_follow_the_torch_npu_version(tmp_path):
    """graph_pool_handle arrived in torch_npu 2.1.0.post17: the generated tables decide, not a list here."""
    (tmp_path / "g.py").write_text("import torch\npool = torch.cuda.graph_pool_handle()\n")
    for version, status in (("2.14.0", "supported"), ("2.1.0.post8", "unsupported")):
        result = run_analyze(tmp_path, "--torch-npu-version", version, "--format", "json")
        assert result.returncode == 0, result.stderr
        apis = {a["api"]: a for a in json.loads(result.stdout)["results"]["torch_apis"]["data"]["apis"]}
        assert apis["torch.cuda.graph_pool_handle"]["status"] == status, version


# --- third_party -----------------------------------------------------------------------------------

EXPECTED_LIBRARY = [
    [
        "minilib.layers.FastNorm",
        "class",
        "minilib/layers.py:20:1",
        "minilib.layers.FastNorm.forward -> minilib.utils.jit_scale",
    ],
    ["minilib.layers.FastNorm.forward", "function", "minilib/layers.py:25:5", "minilib.utils.jit_scale"],
    ["minilib.layers._attn_cuda", "function", "minilib/layers.py:7:1", ""],
    ["minilib.layers.fused_attention", "function", "minilib/layers.py:11:1", "minilib.layers._attn_cuda"],
    ["minilib.utils.jit_scale", "function", "minilib/utils.py:4:1", ""],
    ["minilib.utils.report_gpus", "function", "minilib/utils.py:9:1", ""],
    [
        "minilib.FastNorm",
        "alias",
        "minilib/layers.py:20:1",
        "minilib.layers.FastNorm -> minilib.layers.FastNorm.forward -> minilib.utils.jit_scale",
    ],
    [
        "minilib.fused_attention",
        "alias",
        "minilib/layers.py:11:1",
        "minilib.layers.fused_attention -> minilib.layers._attn_cuda",
    ],
    ["minilib.layers.jit_scale", "alias", "minilib/utils.py:4:1", "minilib.utils.jit_scale"],
    ["minilib.report_gpus", "alias", "minilib/utils.py:9:1", "minilib.utils.report_gpus"],
]


def test_library_call_graph(reports):
    got = rows(reports, "full_unsupported_results.csv")
    assert [[r[0], r[1], r[2], r[4]] for r in got] == EXPECTED_LIBRARY
    reasons = {r[0]: r[3] for r in got}
    assert (
        reasons["minilib.layers._attn_cuda"]
        == "calls the custom operator torch.ops.minilib.attn_fwd (a compiled extension)"
    )
    assert reasons["minilib.utils.jit_scale"].startswith("uses torch.cuda.jiterator._create_jit_fn: jiterator compiles")
    assert reasons["minilib.utils.report_gpus"].startswith("uses torch.cuda.list_gpu_processes")
    assert "minilib.layers.safe_add" not in reasons and "minilib.utils.device_name" not in reasons


def test_cuda_only_packages_and_library_calls(reports):
    assert [r[:4] for r in rows(reports, "cuda_only_packages.csv")] == [
        ["demo/model.py:10:5", "flash_attn.flash_attn_func", "flash_attn", "torch_npu.npu_fusion_attention"],
        ["demo/train.py:7:1", "apex.optimizers.FusedAdam", "apex.optimizers", "torch_npu.optim.NpuFusedAdamW"],
    ]
    assert [r[:2] for r in rows(reports, "unsupported_library_calls.csv")] == [
        ["demo/train.py:29:12", "minilib.FastNorm"],
        ["demo/train.py:43:13", "minilib.fused_attention"],
    ]


def test_api_files_feed_the_library_results_back(reports, tmp_path):
    """The CSV of an --env-path run, given to --api-files, flags the same call sites without the library."""
    result = run_analyze(
        PROJECT / "demo",
        "--mode",
        "third_party",
        "--api-files",
        reports / "full_unsupported_results.csv",
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stderr
    calls = [f for f in json.loads(result.stdout)["findings"] if f["rule"] == "NPU902"]
    assert [(f["location"], f["message"].split(" is unsupported")[0]) for f in calls] == [
        ("train.py:29:12", "minilib.FastNorm"),
        ("train.py:43:13", "minilib.fused_attention"),
    ]
    assert "via minilib.layers.fused_attention -> minilib.layers._attn_cuda" in calls[1]["message"]


def test_third_party_table_entries_are_complete():
    from npu_migrate.program.api import package_table

    table = package_table()
    for name in ("flash_attn", "apex", "xformers", "bitsandbytes", "triton", "deepspeed.ops", "pynvml"):
        assert {"summary", "alternative", "advice"} <= set(table[name]), name


# --- custom_kernels --------------------------------------------------------------------------------


def test_custom_kernels(reports):
    assert [r[:3] for r in rows(reports, "custom_kernels.csv")] == [
        ["demo/ops.py:11:1", "cuda_kernel", "scale_kernel"],
        ["demo/ops.py:26:21", "jit_build", "bias_act"],
        ["demo/ops.py:35:12", "jit_build", "scale"],
        ["kernels/bias_act.cpp:2:1", "cuda_cpp", "bias_act.cpp"],
        ["kernels/bias_act_kernel.cu:4:1", "cuda_kernel", "bias_gelu_kernel"],
        ["kernels/bias_act_kernel.cu:13:1", "cuda_kernel", "row_sum_kernel"],
        ["setup.py:10:9", "extension_build", "demo._bias_act"],
    ]
    by_name = {r[2]: r for r in rows(reports, "custom_kernels.csv")}
    assert by_name["row_sum_kernel"][3] == "atomics, warp shuffles, shared memory, block sync"
    assert by_name["bias_act.cpp"][3] == "uses #include <c10/cuda/CUDAGuard.h>; binds bias_gelu"
    assert by_name["demo._bias_act"][3] == "kernels/bias_act.cpp, kernels/bias_act_kernel.cu"


def test_triton_kernel_and_host_only_builds(tmp_path):
    (tmp_path / "k.py").write_text(
        "import triton\nfrom torch.utils.cpp_extension import load_inline\n\n"
        "@triton.jit\ndef add_kernel(x_ptr, n):\n    pass\n\n"
        "cpu = load_inline('cpu_only', cpp_sources='int f() { return 1; }')\n"
    )
    result = run_analyze(tmp_path, "--mode", "custom_kernels", "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [(f["location"], f["rule"]) for f in doc["findings"]] == [("k.py:5:1", "NPU911")]
    items = doc["results"]["custom_kernels"]["data"]["items"]
    assert [(i["location"], i["kind"], i["name"]) for i in items] == [
        ("k.py:5:1", "triton_kernel", "add_kernel"),
        ("k.py:8:7", "jit_build", "cpu_only"),
    ]


# --- affinity_apis ---------------------------------------------------------------------------------


def _affinity_status(finding) -> str:
    # An SDPA call torch_npu fuses natively (NPU704, left as it is) is no candidate to apply by hand.
    return "applied" if finding.fixed else "native" if finding.data.get("fused") == "native" else "declined"


def test_affinity_api_call_csv(reports):
    from npu_migrate.analyze.modes.affinity_apis import fused_rule_targets, is_fused_site

    got = [[r[0], r[4], r[5], r[6]] for r in rows(reports, "affinity_api_call.csv")]
    mine = [["demo/model.py:85:16", "torch_npu.npu_fast_gelu", "candidate", "NPU921"]]
    if not sdpa_is_a_rule():
        mine.insert(0, [SDPA, "torch_npu.npu_fusion_attention", "candidate", "NPU921"])
    assert [g for g in got if g[3] == "NPU921"] == mine
    targets = fused_rule_targets()
    assert [g for g in got if g[3] != "NPU921"] == [
        [f.location(), targets[f.rule_id], _affinity_status(f), f.rule_id]
        for f in sorted(engine_findings(), key=lambda f: (f.path, f.line, f.col))
        if is_fused_site(f)
    ]
    assert {"torch_npu.npu_rms_norm", "torch_npu.npu_swiglu", "torch_npu.npu_rotary_mul"} <= {g[1] for g in got}


def test_affinity_patterns_and_declined_candidates(tmp_path):
    (tmp_path / "m.py").write_text(
        "import torch\nimport torch.nn.functional as F\n\n\n"
        "def geglu(x):\n    h, gate = x.chunk(2, dim=-1)\n    return h * F.gelu(gate)\n\n\n"
        "def attn(scores, mask, v):\n    scores = scores.masked_fill(mask, float('-inf'))\n"
        "    return torch.softmax(scores, dim=-1) @ v\n\n\n"
        "def rms(x, w):\n    return w * x * torch.rsqrt(x.pow(2).mean(-1) + 1e-6)\n\n\n"
        "opt = torch.optim.AdamW([torch.zeros(1)], lr=1e-3)\n"
    )
    result = run_analyze(tmp_path, "--mode", "affinity_apis", "--format", "json")
    assert result.returncode == 0, result.stderr
    sites = json.loads(result.stdout)["results"]["affinity_apis"]["data"]["sites"]
    assert [(s["location"], s["affinity_api"], s["status"]) for s in sites] == [
        ("m.py:7:12", "torch_npu.npu_geglu", "candidate"),
        ("m.py:12:12", "torch_npu.npu_scaled_masked_softmax", "candidate"),
        ("m.py:15:1", "torch_npu.npu_rms_norm", "declined"),
        ("m.py:19:7", "torch_npu.optim.NpuFusedAdamW", "candidate"),
    ]
    assert "approximate=0)[0]" in sites[0]["reason"]  # GELU on the right half: activate_left stays False
    assert "keepdim" in sites[2]["reason"]  # the fused rule says why it declined


# --- dynamic_shape ---------------------------------------------------------------------------------


def test_dynamic_shape_sources(reports):
    assert rows(reports, "dynamic_shape.csv") == [
        ["demo/data.py:21:1", "collate", "collate_fn"],
        ["demo/model.py:112:9", "control_flow", "if tokens.shape[1] > 2048"],
        ["demo/model.py:122:32", "mask_index", "boolean mask index"],
        ["demo/model.py:122:46", "mask_index", "boolean mask index"],
        ["demo/train.py:40:17", "operator", "torch.nonzero"],
    ]


INSTRUMENTED_SCRIPT = '''"""Runs on CPU: the data decides how many rows survive."""
from __future__ import annotations

import torch


def keep_positive(x):
    idx = torch.nonzero(x > 0).squeeze(1)
    return x[x > 0], idx


def main():
    g = torch.Generator().manual_seed(0)
    for n in (4, 8, 8, 16):
        values, idx = keep_positive(torch.randn(n, generator=g))
        assert values.shape == idx.shape
    print(torch.unique(torch.tensor([1, 1, 2])).tolist())


if __name__ == "__main__":
    main()
'''


@pytest.mark.integration
def test_instrumented_copy_records_the_shapes_it_sees(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "run.py").write_text(INSTRUMENTED_SCRIPT)
    (src / "README.txt").write_text("not python\n")
    out = tmp_path / "instrumented"
    result = run_analyze(src, "--mode", "dynamic_shape", "--instrument", out)
    assert result.returncode == 0, result.stderr
    assert (out / "README.txt").read_text() == "not python\n"
    code = (out / "pkg" / "run.py").read_text()
    compile(code, "run.py", "exec")
    assert code.index("from __future__ import annotations") < code.index("__npu_migrate_shape__ =")
    assert "__npu_migrate_shape__('pkg/run.py:8:11', 'torch.nonzero', torch.nonzero(x > 0)).squeeze(1)" in code
    csv_path = tmp_path / "shapes.csv"
    run = subprocess.run(
        [sys.executable, str(out / "pkg" / "run.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "NPU_MIGRATE_SHAPES_CSV": str(csv_path)},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[1, 2]"  # behaviour unchanged
    table = {r[0]: r for r in read_csv(csv_path)[1:]}
    assert set(table) == {"pkg/run.py:8:11", "pkg/run.py:9:12", "pkg/run.py:17:11"}
    nonzero = table["pkg/run.py:8:11"]
    assert nonzero[1:3] == ["torch.nonzero", "4"]
    mask = table["pkg/run.py:9:12"]
    assert mask[1:3] == ["boolean mask index", "4"]
    assert int(nonzero[3]) >= 2 and nonzero[4].count("x") == 1  # 2-D nonzero output, varying row count
    assert table["pkg/run.py:17:11"][1:5] == ["torch.unique", "1", "1", "2"]


# --- model -----------------------------------------------------------------------------------------


def test_model_architecture(reports):
    assert [r[:2] for r in rows(reports, "model_classes.csv")] == [
        ["demo/model.py:15:1", "RMSNorm"],
        ["demo/model.py:39:1", "RotaryEmbedding"],
        ["demo/model.py:51:1", "Attention"],
        ["demo/model.py:72:1", "SwiGLU"],
        ["demo/model.py:83:1", "QuickGELU"],
        ["demo/model.py:88:1", "Block"],
        ["demo/model.py:101:1", "TinyLlama"],
    ]
    assert [r[:3] for r in rows(reports, "model_layers.csv")] == [
        ["attention", "Attention (custom)", "1"],
        ["embedding", "nn.Embedding", "1"],
        ["linear", "nn.Linear", "6"],
        ["mlp", "SwiGLU (custom)", "1"],
        ["normalization", "RMSNorm (custom)", "1"],
        ["positional", "RotaryEmbedding (custom)", "1"],
    ]
    assert rows(reports, "model_distributed.csv") == [
        ["process group", "backend=nccl", "demo/train.py:17:5"],
        ["DDP", "DistributedDataParallel", "demo/train.py:26:13"],
        ["GradScaler", "torch.cuda.amp.GradScaler", "demo/train.py:28:14"],
        ["autocast", "torch.cuda.amp.autocast(dtype=torch.bfloat16)", "demo/train.py:34:14"],
    ]


def test_model_computation(reports):
    operators = rows(reports, "model_operators.csv")
    assert [r[:4] for r in operators] == [
        ["1", "attention", "F.scaled_dot_product_attention", "1"],
        ["3", "linear", "nn.Linear", "6"],
        ["4", "normalization", "torch.rsqrt", "1"],
        ["6", "loss", "F.cross_entropy", "1"],
        ["6", "embedding", "nn.Embedding", "1"],
        ["7", "activation", "F.gelu", "1"],
        ["7", "activation", "F.silu", "1"],
        ["7", "activation", "torch.sigmoid", "1"],
    ]
    assert all(r[4].startswith("native") for r in operators)
    fusion = [[r[0], r[2]] for r in rows(reports, "model_fusion.csv")]
    assert ["rms_norm", "demo/model.py:21:5"] in fusion and ["swiglu", "demo/model.py:79:5"] in fusion
    assert ["rotary_mul", "demo/model.py:35:1"] in fusion
    assert (["fusion_attention", SDPA] if sdpa_is_a_rule() else ["flash_attention", SDPA]) in fusion
    assert not any(p == "linear+act" for p, _ in fusion)  # silu(gate(x)) * up(x) is a gate, not linear+act


def test_model_memory(reports, document):
    assert rows(reports, "model_dataloaders.csv") == [["demo/data.py:28:12", "batch_size", "", "", "", "", "collate"]]
    assert [r[0] for r in rows(reports, "model_syncs.csv")] == ["demo/train.py:41:36", "demo/train.py:42:9"]
    memory = document["results"]["model"]["data"]["memory"]
    assert memory["mixed_precision"] == ["torch.cuda.amp.GradScaler", "torch.cuda.amp.autocast(dtype=torch.bfloat16)"]
    assert memory["gradient_checkpointing"] == [] and memory["gradient_accumulation"] == []
    advice = document["results"]["model"]["data"]["advice"]
    assert [a.split(":")[0] for a in advice] == ["no gradient checkpointing", "no gradient accumulation"]


def test_complexity_rating(document):
    rating = document["results"]["model"]["data"]["complexity"]
    assert rating["rating"] == "Medium"
    fixed = sum(f.fixed for f in engine_findings())
    assert rating["reasons"] == [
        "2 CUDA kernels using shared memory, shuffles, atomics or CUDA libraries: 4-12 person-days",
        "4 CUDA extension builds and C++ bindings to build for the NPU: 2-4 person-days",
        "2 library functions the code calls that cannot run on an NPU: minilib.FastNorm, minilib.fused_attention: "
        "1-4 person-days",
        "CUDA-only packages to switch to an Ascend counterpart: apex, flash_attn: 1-4 person-days",
        "distributed training (DDP): 1-3 person-days",
        "1 plain CUDA kernel: 1-2 person-days",
        "5 data-dependent shapes to measure and pad to fixed sizes: 0.5-1 person-days",
        "1 torch API with no NPU support: torch.cuda.get_device_properties: 0.25-1 person-days",
        "2 host-device syncs inside loops: 0.1-0.2 person-days",
        f"review the {fixed} sites `npu-migrate apply` rewrites: {round(fixed * 0.005, 2):g}-{round(fixed * 0.01, 2):g} "
        "person-days",
        "test on an NPU: 0.5-1 person-days",
    ]
    assert rating["effort_days"] == [11.0, 33.0]
    assert rating["effort"] == "11-33 person-days"


def test_a_cuda_free_project_is_low(tmp_path):
    (tmp_path / "m.py").write_text("import torch\n\nclass M(torch.nn.Module):\n    pass\n")
    result = run_analyze(tmp_path, "--mode", "model", "--format", "json")
    assert result.returncode == 0, result.stderr
    rating = json.loads(result.stdout)["results"]["model"]["data"]["complexity"]
    assert rating["rating"] == "Low"
    assert rating["reasons"] == ["no CUDA-specific code found", "test on an NPU: 0.5-1 person-days"]


# --- output formats --------------------------------------------------------------------------------


def test_output_folder_contents(reports):
    assert sorted(p.name for p in reports.iterdir()) == sorted(
        [
            "affinity_api_call.csv",
            "api_performance_advice.csv",
            "api_precision_advice.csv",
            "cuda_only_packages.csv",
            "cuda_op_list.csv",
            "custom_kernels.csv",
            "dynamic_shape.csv",
            "full_unsupported_results.csv",
            "model_classes.csv",
            "model_dataloaders.csv",
            "model_distributed.csv",
            "model_fusion.csv",
            "model_layers.csv",
            "model_operators.csv",
            "model_syncs.csv",
            "report.html",
            "report.json",
            "report.md",
            "report.sarif",
            "torch_api_list.csv",
            "training_levers.csv",
            "unknown_api.csv",
            "unsupported_api.csv",
            "unsupported_library_calls.csv",
        ]
    )


def test_sarif_is_valid_and_every_result_names_its_rule(reports):
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    sarif = json.loads((reports / "report.sarif").read_text(encoding="utf-8"))
    jsonschema.validators.validator_for(schema)(schema).validate(sarif)
    run = sarif["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert len(run["results"]) == len(expected_analysis()) + len(engine_findings())
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        location = result["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uriBaseId"] == "SRCROOT"
        assert not location["artifactLocation"]["uri"].startswith("/")
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == PROJECT.resolve().as_uri() + "/"


def test_markdown_links_findings_to_rules(reports):
    text = (reports / "report.md").read_text(encoding="utf-8")
    assert "## Migration complexity: Medium" in text
    assert "npu_migrate.analyze" not in text  # the heuristic in words, not module names
    # The paths of the text report (and `apply`) from the folder analyze ran in, not the root's (issue #25).
    assert f"| `{SHOWN_FROM_ROOT}demo/train.py:43:13` | [NPU902](#rule-npu902) | error |" in text
    assert '<a id="rule-npu902"></a>NPU902 unsupported-library-call' in text


def test_html_is_self_contained_and_links_rules(reports):
    text = (reports / "report.html").read_text(encoding="utf-8")
    assert "<script src" not in text and "<link" not in text and "http://" not in text.replace("http://www.w3.org", "")
    assert "<script" not in text  # nothing drawn by a script: readable with JavaScript off
    cited = {f["rule"] for f in json.loads((reports / "report.json").read_text(encoding="utf-8"))["findings"]}
    for rule in all_rules():
        # Each rule reported has its group of findings and its documentation, linked; the others stay out.
        assert (f'id="rule-{rule.id}"' in text) == (rule.id in cited)
        assert (f'href="#doc-{rule.id}"' in text and f'id="doc-{rule.id}"' in text) == (rule.id in cited)
    assert "&lt;c10/cuda/CUDAGuard.h&gt;" in text  # table cells are escaped


def test_text_and_csv_formats(tmp_path):
    result = run_analyze(PROJECT / "demo", "--format", "csv")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "location,rule,severity,category,fixed,message"
    # Relative to the current folder, where the tree is under it, as `apply` shows the file.
    assert lines[1].startswith(
        "fixtures/projects/analyze_demo/demo/model.py:42:66,NPU951,warning,torch_apis,False,torch.float64: "
    )
    text = run_analyze(PROJECT / "demo")
    assert text.returncode == 0
    assert "train.py:30:8: NPU204 `torch.cuda.get_device_properties`" in text.stdout
    # analyze writes no file: what apply would rewrite is fixable, not fixed.
    assert "train.py:19:5: NPU201 [fixable] `torch.cuda.set_device`" in text.stdout and "[fixed]" not in text.stdout
    assert (
        "torch_apis: 37 distinct torch APIs in 54 uses (torch_npu 2.14.0): 34 supported, 1 unsupported, 2 unknown"
        in text.stdout
    )


def test_analyze_shows_the_paths_apply_shows_from_a_parent_folder(tmp_path):
    """Issue #25: run from above the tree, analyze's findings and location columns name a file as apply's
    diff and findings do (relative to the current folder), not relative to the analysed root."""
    package = tmp_path / "proj" / "pkg"
    package.mkdir(parents=True)
    (package / "mod.py").write_text(
        "import torch\n\n\ndef f(x):\n    torch.cuda.synchronize()\n    return x.cuda()\n", encoding="utf-8"
    )
    applied = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", "--diff", "--show-fixes", "-j", "1", "proj"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=300,
    )
    assert applied.returncode == 0, applied.stderr
    apply_says = applied.stdout + applied.stderr
    assert "+++ b/proj/pkg/mod.py" in apply_says
    assert "proj/pkg/mod.py:5:5: NPU201" in apply_says

    text = run_analyze("proj", "-j", "1", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "proj/pkg/mod.py:5:5: NPU201 [fixable]" in text.stdout
    assert "\npkg/mod.py" not in "\n" + text.stdout
    as_csv = run_analyze("proj", "-j", "1", "--format", "csv", cwd=tmp_path)
    assert any(line.startswith("proj/pkg/mod.py:5:5,NPU201,") for line in as_csv.stdout.splitlines())
    written = run_analyze("proj", "-j", "1", "-q", "--output", "out", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    rows = read_csv(tmp_path / "out" / "cuda_op_list.csv")
    assert [r[0] for r in rows[1:]] == ["proj/pkg/mod.py:5:5", "proj/pkg/mod.py:6:12"]
    # The reports people read say it as the text report does: findings and table locations alike.
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "| `proj/pkg/mod.py:5:5` | [NPU201]" in md
    assert "| proj/pkg/mod.py:6:12 |" in md, "a table's location column"
    assert "`pkg/mod.py:" not in md and "| pkg/mod.py:" not in md
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert '<td class="loc">proj/pkg/mod.py:5:5</td>' in page
    assert '<td class="loc">pkg/mod.py' not in page
    for fmt, shown in (("markdown", md), ("html", page)):
        printed = run_analyze("proj", "-j", "1", "--format", fmt, cwd=tmp_path).stdout
        assert "proj/pkg/mod.py:5:5" in printed and printed.split("\n")[2:] == shown.split("\n")[2:], fmt
    # report.json names its root and SARIF its base URI: their paths stay relative to the analysed root.
    document = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert {f["location"].split(":")[0] for f in document["findings"]} == {"pkg/mod.py"}
    sarif = json.loads((tmp_path / "out" / "report.sarif").read_text(encoding="utf-8"))
    wheres = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in sarif["runs"][0]["results"]]
    assert {(w["uri"], w["uriBaseId"]) for w in wheres} == {("pkg/mod.py", "SRCROOT")}


# --- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing_dir"], "missing_dir: no such file or directory"),
        ([".", "--torch-npu-version", "9.9"], "unknown torch_npu version '9.9'"),
        ([".", "--mode", "torch_apis", "--instrument", "out"], "--instrument needs --mode dynamic_shape"),
        ([".", "--mode", "third_party", "--env-path", "nowhere"], "nowhere: no such file or directory"),
        ([".", "--mode", "third_party", "--api-files", "nothing.csv"], "nothing.csv: cannot read --api-files CSV"),
        ([".", "--mode", "third_party", "--api-files", "bad.csv"], "bad.csv: not a full_unsupported_results.csv"),
        ([".", "--mode", "dynamic_shape", "--instrument", "inside"], "is inside the analysed tree"),
        ([".", "--output", "afile"], "--output afile: exists and is not a folder"),
    ],
)
def test_usage_and_io_errors_exit_2_with_a_message(tmp_path, args, message):
    (tmp_path / "ok.py").write_text("import torch\n")
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    (tmp_path / "afile").write_text("")
    result = run_analyze(*args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_unparsable_file_is_named_and_the_rest_reported(tmp_path):
    (tmp_path / "broken.py").write_text("import torch\ndef f(:\n")
    (tmp_path / "good.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    out = tmp_path / "out"
    result = run_analyze(tmp_path, "--output", out, "--format", "json")
    assert result.returncode == 2
    assert "broken.py: error: syntax error at line 2" in result.stderr
    assert "Traceback" not in result.stderr
    doc = json.loads(result.stdout)
    assert [f["location"] for f in doc["findings"]] == ["good.py:1:1", "good.py:2:1"]
    assert doc["errors"] == [{"path": "broken.py", "error": "syntax error at line 2: invalid syntax"}]
    assert (out / "report.html").is_file()
