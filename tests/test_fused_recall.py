"""Issue #23: the recall of NPU701 / NPU702 / NPU704 / NPU706 in packages nobody here read, pinned.

`benchmarks/fused_recall.py` downloads pinned packages from PyPI (`pip download --no-deps`, never installed
or imported) and runs the rules on the sites listed in `benchmarks/fused_sites.csv`. Here a subset of small
packages covering the four rules: per rule, the fused count must not fall below what the list records, each
listed function must still exist (a renamed site would silently drop out of the count), and every decline
says why and what to do. The last test runs the measurement on a package of our own in a cache, offline:
each status (fused, declined, native beside SDPA, silent, missing) is read as the rules report it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fused_recall  # noqa: E402

SUBSET = ["litgpt", "mistral-inference", "llama-models", "vit-pytorch", "recurrent-memory-transformer-pytorch"]


@pytest.fixture(scope="module")
def report():
    try:
        return fused_recall.measure(SUBSET)
    except subprocess.CalledProcessError as error:  # no index to download from: nothing to measure
        pytest.skip(f"pip download failed: {error.stderr.strip()[-300:]}")


def _expected(rule: str, package: str) -> list[fused_recall.Site]:
    return [s for s in fused_recall.known_sites() if s.rule == rule and s.package == package]


@pytest.mark.integration  # downloads from PyPI
def test_the_subset_covers_every_rule_with_a_fused_site(report):
    for rule in fused_recall.RULES:
        assert any(s.expected == "fused" for p in SUBSET for s in _expected(rule, p)), rule


@pytest.mark.integration  # downloads from PyPI
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


@pytest.mark.integration  # downloads from PyPI
def test_every_declined_site_says_why_and_what_to_do(report):
    for by_package in report.values():
        for entry in by_package.values():
            for row in entry["rows"]:
                if row["status"] == "declined":
                    assert "; to fuse it, " in row["why"] or "; nothing in the code can: " in row["why"], row


# -- the measurement itself, on a package of our own in a cache (no download) ---------------------------

OWN = """
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.RMSNorm(width)
        self.fast = True

    def gated(self, a, b):
        return F.silu(a) * b

    def halves(self, t):
        up, gate = t.chunk(2, dim=-1)
        return F.silu(gate) * up

    def attend(self, q, k, v):
        if self.fast:
            return F.scaled_dot_product_attention(q, k, v)
        w = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(dim=-1)
        return w @ v

    def plain(self, x):
        def inner(y):
            return F.silu(y) * y
        return x + 1
"""


def test_statuses_are_read_from_the_rules_findings(tmp_path, monkeypatch):
    root = tmp_path / "own-pkg-1.0"
    (root / "own").mkdir(parents=True)
    (root / "own" / "block.py").write_text(OWN, encoding="utf-8")
    (root / ".complete").write_text("own")
    sites = tmp_path / "sites.csv"
    sites.write_text(
        "rule,package,file,function,expected\n"
        "NPU706,own-pkg,own/block.py,Block.__init__,fused\n"
        "NPU702,own-pkg,own/block.py,Block.gated,fused\n"
        "NPU702,own-pkg,own/block.py,Block.halves,declined\n"
        "NPU704,own-pkg,own/block.py,Block.attend,native\n"
        "NPU702,own-pkg,own/block.py,Block.plain,silent\n"
        "NPU701,own-pkg,own/block.py,Block.renamed,silent\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(fused_recall, "SITES", sites)
    monkeypatch.setitem(fused_recall.PACKAGES, "own-pkg", "1.0")
    report = fused_recall.measure(["own-pkg"], cache=tmp_path)
    got = {(rule, r["function"]): r["status"] for rule, b in report.items() for r in b["own-pkg"]["rows"]}
    assert got == {
        ("NPU706", "Block.__init__"): "fused",
        ("NPU702", "Block.gated"): "fused",
        ("NPU702", "Block.halves"): "declined",
        ("NPU704", "Block.attend"): "native",
        # the nested function's finding is its own, not the enclosing function's
        ("NPU702", "Block.plain"): "silent",
        ("NPU701", "Block.renamed"): "missing",
    }
    assert report["NPU702"]["own-pkg"]["fused"] == 1 and report["NPU702"]["own-pkg"]["declined"] == 1
