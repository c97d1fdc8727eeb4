"""Issue #23: the recall of NPU701 / NPU702 / NPU704 / NPU706 in packages nobody here read, pinned.

`benchmarks/fused_recall.py` downloads pinned packages from PyPI (`pip download --no-deps`, never installed
or imported) and runs the rules on the sites listed in `benchmarks/fused_sites.csv`. Here a subset of small
packages covering the four rules: per rule, the fused count must not fall below what the list records, each
listed function must still exist (a renamed site would silently drop out of the count), and every decline
says why and what to do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fused_recall  # noqa: E402

pytestmark = pytest.mark.integration  # downloads from PyPI

SUBSET = ["litgpt", "mistral-inference", "llama-models", "vit-pytorch", "recurrent-memory-transformer-pytorch"]


@pytest.fixture(scope="module")
def report():
    try:
        return fused_recall.measure(SUBSET)
    except subprocess.CalledProcessError as error:  # no index to download from: nothing to measure
        pytest.skip(f"pip download failed: {error.stderr.strip()[-300:]}")


def _expected(rule: str, package: str) -> list[fused_recall.Site]:
    return [s for s in fused_recall.known_sites() if s.rule == rule and s.package == package]


def test_the_subset_covers_every_rule_with_a_fused_site(report):
    for rule in fused_recall.RULES:
        assert any(s.expected == "fused" for p in SUBSET for s in _expected(rule, p)), rule


def test_the_subset_fuses_no_fewer_sites_than_recorded(report):
    for rule, by_package in report.items():
        for package in SUBSET:
            expected = _expected(rule, package)
            if not expected:
                assert package not in by_package, (rule, package)
                continue
            entry = by_package[package]
            assert entry["known"] == len(expected), (rule, package)
            assert not [r for r in entry["rows"] if r["status"] == "missing"], entry["rows"]
            recorded = sum(s.expected == "fused" for s in expected)
            assert entry["fused"] >= recorded, (rule, package, entry["rows"])
    print({r: {p: f"{e['fused']}/{e['known']}" for p, e in b.items()} for r, b in report.items()})


def test_every_declined_site_says_why_and_what_to_do(report):
    for by_package in report.values():
        for entry in by_package.values():
            for row in entry["rows"]:
                if row["status"] == "declined":
                    assert "; to fuse it, " in row["why"] or "; nothing in the code can: " in row["why"], row
