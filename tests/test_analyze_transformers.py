"""`analyze --mode all` over the installed transformers package (2,900 files): it completes, names no
file as failed, and its reports are consistent. Marked `slow` (run by default; `-m "not slow"` skips it)."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_mode_all_on_the_transformers_tree(tmp_path):
    spec = importlib.util.find_spec("transformers")
    assert spec is not None, "the test extras install transformers"
    tree = Path(spec.submodule_search_locations[0])
    out = tmp_path / "out"
    started = time.monotonic()
    # --no-gitignore: the package sits in a virtualenv that the repository's .gitignore lists.
    # In pytest's process group, so whatever stops the test run stops the analysis and its workers too.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "npu_migrate.analyze.cli",
            str(tree),
            "--mode",
            "all",
            "--no-gitignore",
            "--output",
            str(out),
            "--format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass  # pool workers still hold the pipes; they exit once they see their parent gone
        pytest.fail("analyze --mode all on transformers took longer than 1200 s")
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    doc = json.loads(stdout)
    assert doc["summary"]["files_scanned"] > 2500 and doc["summary"]["files_failed"] == 0
    assert doc["errors"] == []
    by_category = doc["summary"]["by_category"]
    assert {"cuda_api", "device", "third_party", "dynamic_shape", "model", "affinity_apis"} <= set(by_category)
    sarif = json.loads((out / "report.sarif").read_text(encoding="utf-8"))
    assert len(sarif["runs"][0]["results"]) == doc["summary"]["findings"]
    with (out / "cuda_only_packages.csv").open(newline="", encoding="utf-8") as handle:
        packages = {row[2] for row in list(csv.reader(handle))[1:]}
    assert {"flash_attn", "bitsandbytes"} <= packages
    assert (out / "report.html").stat().st_size < 60_000_000
    # Calibration of the estimate on a large tree: no CUDA kernels, so no kernel port; what weighs is the review
    # of a thousand rewrites, dynamic shapes, bitsandbytes: weeks, and the rating says Medium.
    complexity = doc["results"]["model"]["data"]["complexity"]
    assert complexity["rating"] == "Medium", complexity["reasons"]
    assert any(
        r.startswith("CUDA-only package with no Ascend counterpart: bitsandbytes") for r in complexity["reasons"]
    )
    print(f"analyze --mode all on {doc['summary']['files_scanned']} files: {elapsed:.1f} s")
