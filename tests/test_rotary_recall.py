"""Issue #23: NPU703's recall on rotary embeddings in packages nobody here read, pinned.

`benchmarks/rotary_recall.py` downloads pinned packages from PyPI (`pip download --no-deps`, never
installed or imported) and runs NPU703 on the rotary sites listed in `benchmarks/rotary_sites.csv`. Here a
subset of small packages: the fused count must not fall below what the list records, and each listed
function must still exist (a renamed site would silently drop out of the count).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rotary_recall  # noqa: E402

pytestmark = pytest.mark.integration  # downloads from PyPI

SUBSET = ["litgpt", "local-attention", "mistral-inference", "palm-rlhf-pytorch", "rotary-embedding-torch"]


@pytest.fixture(scope="module")
def report():
    try:
        return rotary_recall.measure(SUBSET)
    except subprocess.CalledProcessError as error:  # no index to download from: nothing to measure
        pytest.skip(f"pip download failed: {error.stderr.strip()[-300:]}")


def test_the_subset_fuses_no_fewer_rotary_sites_than_recorded(report):
    for package in SUBSET:
        entry = report[package]
        expected = [s for s in rotary_recall.known_sites() if s.package == package]
        assert entry["known"] == len(expected) > 0, package
        assert not [r for r in entry["rows"] if r["status"] == "missing"], entry["rows"]
        recorded = sum(s.expected == "fused" for s in expected)
        assert entry["fused"] >= recorded, (package, entry["rows"])
    print({p: f"{e['fused']}/{e['known']} fused" for p, e in report.items()})


def test_every_declined_site_says_why_and_what_to_do(report):
    for entry in report.values():
        for row in entry["rows"]:
            if row["status"] == "declined":
                assert "; to fuse it, " in row["why"] or "; nothing in the code can: " in row["why"], row
