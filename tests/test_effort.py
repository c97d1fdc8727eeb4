"""The migration rating and effort estimate: stated in words, capped where sites repeat, rated by the upper
end of the range, and calibrated on real projects (the example, the fixtures; transformers in
test_analyze_transformers.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import ROOT
from test_analyze import run_analyze

from npu_migrate.analyze import effort

EXAMPLES = ROOT / "examples"
PROJECTS = ROOT / "fixtures" / "projects"


def test_an_item_costs_its_weight_per_occurrence_up_to_its_cap():
    one = effort.item("complex_kernel", "1 kernel")
    assert one.days == effort.WEIGHTS["complex_kernel"].per_item
    three = effort.item("complex_kernel", "3 kernels", 3)
    assert three.days == tuple(3 * d for d in one.days)
    many = effort.item("sync_in_loop", "400 syncs", 400)
    assert many.days == effort.WEIGHTS["sync_in_loop"].cap  # 400 syncs are one habit to fix, not 40 days


def test_the_rating_follows_the_upper_end_and_the_largest_item_comes_first():
    small = effort.rate([effort.item("sync_in_loop", "2 syncs", 2)], automatic=12)
    assert small["rating"] == "Low"
    assert small["reasons"][0] == "2 syncs: 0.1-0.2 person-days"
    assert small["reasons"][1:] == [
        "review the 12 sites `npu-migrate apply` rewrites: 0.06-0.12 person-days",  # minutes a site
        "test on an NPU: 0.5-1 person-days",  # once, always last
    ]
    medium = effort.rate([effort.item("distributed", "DDP"), effort.item("package_with_alternative", "apex")], 0)
    assert medium["rating"] == "Medium" and medium["effort_days"] == [2.0, 6.0]
    assert medium["reasons"][0].startswith("DDP: ")  # 1-3 days before apex's 0.5-2
    kernels = effort.rate([effort.item("complex_kernel", "8 kernels", 8)], 0)
    assert kernels["rating"] == "High" and kernels["effort_days"] == [16.0, 49.0]


def test_nothing_to_do_is_low_and_says_so():
    rating = effort.rate([], automatic=0)
    assert rating["rating"] == "Low"
    assert rating["reasons"] == ["no CUDA-specific code found", "test on an NPU: 0.5-1 person-days"]


def test_the_heuristic_is_stated_in_words_without_internal_names():
    lines = effort.heuristic()
    assert len(lines) == len(effort.WEIGHTS) + 2
    assert "1-2 days: each plain (element-wise) CUDA kernel" in "\n".join(lines)
    assert "Low up to 5 days, Medium up to 40 days, High above" in lines[-1]
    assert not any("npu_migrate." in line or "WEIGHTS" in line or "_" in line.split(":")[1] for line in lines[:-2])


def test_reviewing_many_rewrites_is_days_not_weeks():
    rating = effort.rate([], automatic=1114)  # what apply rewrites across the transformers package
    assert rating["reasons"][0] == "review the 1114 sites `npu-migrate apply` rewrites: 3-5 person-days"
    assert rating["rating"] == "Medium"


@pytest.mark.parametrize(
    ("tree", "rating", "driver"),
    [
        # apply rewrites everything (the capability check too): what is left is two syncs in the loop.
        (EXAMPLES / "tiny_cnn", "Low", "sync_in_loop"),
        # DDP and AMP are rewritten by apply; what is left is a multi-card run to check them.
        (PROJECTS / "ddp_amp", "Low", "distributed"),
        (PROJECTS / "smoke_runs", "Low", "distributed"),
        # Three small CUDA kernels, their builds, a library with compiled ops, flash_attn, apex, DDP: weeks, not
        # months (the old estimate said High, 89.5-179 days, for these six Python files).
        (PROJECTS / "analyze_demo", "Medium", "complex_kernel"),
        # One transformers model (modeling, configuration, tokenizers): apply rewrites the fused idioms, one is
        # left by hand. The whole package is Medium, 12-30 days (test_analyze_transformers.py).
        pytest.param(Path("transformers", "models", "llama"), "Low", "fused_declined", marks=pytest.mark.integration),
    ],
    ids=lambda v: "/".join(v.parts[-2:]) if hasattr(v, "parts") else str(v),
)
def test_calibration_on_the_projects_of_this_repository(tree, rating, driver):
    if tree.parts[0] == "transformers":  # found, not imported: importing transformers costs seconds
        tree = Path(importlib.util.find_spec("transformers").submodule_search_locations[0]).parent / tree
    # --no-gitignore: the transformers package sits in a virtualenv that the repository's .gitignore lists.
    result = run_analyze(tree, "--mode", "model", "--format", "json", "--no-gitignore")
    assert result.returncode == 0, result.stderr
    model = json.loads(result.stdout)["results"]["model"]
    complexity = model["data"]["complexity"]
    assert complexity["rating"] == rating, complexity["reasons"]
    assert complexity["drivers"][0] == driver
    # The terminal summary says the rating, the range and what weighs most.
    expected = f"migration complexity: {rating} ({complexity['effort']}); the largest item: {complexity['reasons'][0]}"
    assert expected in model["summary"]
