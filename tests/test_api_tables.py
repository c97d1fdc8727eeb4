"""Checks on transforms/data/torch_npu_api.toml and the script that generates it.

No network: the TOML is read as committed, and the generator's serialiser and
version ordering are imported from scripts/generate_api_tables.py by path
(scripts/ is not a package).
"""

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TOML_PATH = REPO_ROOT / "transforms" / "data" / "torch_npu_api.toml"
SCRIPT_PATH = REPO_ROOT / "scripts" / "generate_api_tables.py"

LIST_KEYS = ("npu_all", "npu_attributes", "npu_amp", "distributed", "fused_ops")


@pytest.fixture(scope="module")
def tables():
    with TOML_PATH.open("rb") as handle:
        return tomllib.load(handle)


@pytest.fixture(scope="module")
def generator():
    # The generator imports its sibling module `wheels` by name, as it does when run as a script.
    sys.path.insert(0, str(SCRIPT_PATH.parent))
    try:
        spec = importlib.util.spec_from_file_location("generate_api_tables", SCRIPT_PATH)
        module = importlib.util.module_from_spec(spec)
        # dataclasses resolves string annotations through sys.modules.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT_PATH.parent))
    return module


def test_meta_versions_match_tables_and_default_is_newest(tables, generator):
    meta = tables["meta"]
    assert meta["versions"] == sorted(meta["versions"], key=generator.version_key)
    assert list(tables["versions"]) == meta["versions"]
    assert meta["default"] == meta["versions"][-1]
    assert meta["torch_reference"].count(".") == 2 and "+" not in meta["torch_reference"]


def test_post_releases_order_by_pep_440(generator):
    # String order would put 2.10 before 2.9 and .post17 before .post8.
    ordered = ["2.1.0.post8", "2.1.0.post17", "2.5.1rc1", "2.5.1", "2.5.1.post1", "2.9.1", "2.10.0"]
    assert sorted(reversed(ordered), key=generator.version_key) == ordered


def test_every_version_has_core_surface(tables):
    for version, table in tables["versions"].items():
        assert "synchronize" in table["npu_all"], version
        assert "device_count" in table["npu_all"], version
        assert {"autocast", "GradScaler"} <= set(table["npu_amp"]), version
        assert "is_hccl_available" in table["distributed"], version
        assert "npu_rms_norm" in table["fused_ops"], version
        assert table["fused_op_schemas"]["npu_rms_norm"].startswith("npu_rms_norm(Tensor self"), version
        assert table["wheel"].startswith(f"torch_npu-{version}-"), version


def test_lists_are_sorted_and_unique(tables):
    for key, names in tables["torch_cuda"].items():
        assert names == sorted(set(names)), f"torch_cuda.{key}"
    for version, table in tables["versions"].items():
        for key in LIST_KEYS:
            assert table[key] == sorted(set(table[key])), f"{version}.{key}"
        assert not set(table["npu_all"]) & set(table["npu_attributes"]), version


def test_graph_api_arrives_after_2_1_0_post8(tables):
    versions = tables["versions"]
    assert "NPUGraph" not in versions["2.1.0.post8"]["npu_all"]
    assert "NPUGraph" in versions["2.14.0"]["npu_all"]
    # Backported to the 2.1 line, so a "since 2.x" rule would be wrong.
    assert "NPUGraph" in versions["2.1.0.post17"]["npu_all"]


def test_npurt_absent_from_old_lines_present_from_2_13(tables, generator):
    for version, table in tables["versions"].items():
        if generator.version_key(version) < generator.version_key("2.7.0"):
            assert "npurt" not in table["npu_all"], version
        if generator.version_key(version) >= generator.version_key("2.13.0"):
            assert "npurt" in table["npu_all"], version


def test_torch_cuda_surface(tables):
    cuda = tables["torch_cuda"]
    assert {"CUDAGraph", "synchronize", "is_available", "nvtx"} <= set(cuda["all"])
    assert {"autocast", "GradScaler"} <= set(cuda["amp"])
    assert "sdp_kernel" in cuda["backends_cuda"]


def test_sdp_switches_leave_all_but_stay_attributes(tables):
    post8, post17 = tables["versions"]["2.1.0.post8"], tables["versions"]["2.1.0.post17"]
    assert "enable_flash_sdp" in post8["npu_all"]
    assert "enable_flash_sdp" not in post17["npu_all"]
    assert "enable_flash_sdp" in post17["npu_attributes"]


def test_rotary_mode_flag_agrees_with_schema(tables):
    for version, table in tables["versions"].items():
        schema = table["fused_op_schemas"].get("npu_rotary_mul", "")
        assert table["rotary_mul_has_rotary_mode"] == ("rotary_mode" in schema), version
    assert tables["versions"]["2.1.0.post8"]["rotary_mul_has_rotary_mode"] is False
    assert tables["versions"]["2.14.0"]["rotary_mul_has_rotary_mode"] is True


def test_serialiser_round_trips(generator):
    sample = {
        "meta": {"default": "2.14.0", "versions": ["2.1.0.post8", "2.14.0"], "flag": False},
        "versions": {
            "2.14.0": {
                "npu_all": [f"name_{index}" for index in range(30)],
                "empty": [],
                "has_mode": True,
                "fused_op_schemas": {
                    "npu_x": "npu_x(Tensor self, str layout=\"BSH\", str mode='half') -> Tensor",
                    "odd key": "back\\slash\ttab\nnewline",
                },
            },
        },
    }
    text = generator.dump_toml(sample, "header line")
    assert text.startswith("# header line\n")
    assert tomllib.loads(text) == sample
    # Stable output is what keeps regenerations diff-friendly.
    assert generator.dump_toml(tomllib.loads(text), "header line") == text


def test_committed_file_is_what_the_serialiser_writes(tables, generator):
    assert generator.dump_toml(tables, generator.HEADER) == TOML_PATH.read_text(encoding="utf-8")
