"""`apply --output`'s change_list.csv: a row per rewrite and per thing left to a person, paths in the output
tree, and cells a spreadsheet can show (a fused rewrite replaces a whole method: its cell names it)."""

from __future__ import annotations

import csv
import shutil

from conftest import ROOT
from test_cli import run_cli

from npu_migrate.output.report import CHANGE_CELL

FUSED = ROOT / "fixtures" / "rules" / "NPU701" / "llama_style.in.py"
TRAIN = "import torch\n\nx = torch.ones(2).cuda()\nsms = torch.cuda.get_device_properties(0).multi_processor_count\n"


def test_change_list_has_rewrites_and_manual_work_with_output_relative_paths(tmp_path):
    src = tmp_path / "project" / "src"
    (src / "model").mkdir(parents=True)
    shutil.copy(FUSED, src / "model" / "norm.py")
    (src / "train.py").write_text(TRAIN)
    out = tmp_path / "migrated"
    result = run_cli("apply", "project/src", "--output", out, "--select", "ALL", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader((out / "change_list.csv").open(encoding="utf-8")))
    for row in rows:
        assert (out / row["file"]).is_file(), f"{row['file']} is not a path in the output tree"
    by_rule = {(r["file"], r["rule"], r["status"]) for r in rows}
    assert ("train.py", "NPU101", "rewritten") in by_rule
    assert ("train.py", "NPU204", "to do by hand") in by_rule  # no NPU counterpart: a person decides
    fused = [r for r in rows if r["rule"] == "NPU701" and r["status"] == "rewritten"]
    assert fused and all(r["file"] == "model/norm.py" for r in fused)
    for row in rows:
        for cell in (row["original"], row["replacement"]):
            assert "\n" not in cell and len(cell) <= CHANGE_CELL
    assert any("lines; see the migrated file" in r["original"] for r in fused)
    statuses = [r["status"] for r in rows]
    assert statuses == sorted(statuses, key=lambda s: s != "rewritten")  # the rewrites, then the work left
