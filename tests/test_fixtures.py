"""Fixture pairs, one folder per rule: `fixtures/rules/<RULE>/<case>.in.py` -> `<case>.out.py` (or
`.in.sh` -> `.out.sh`, `.in.ipynb` -> `.out.ipynb`, ...: the name without `.in` decides the file kind).

Each case runs with only its folder's rule selected (or the rules listed in the folder's `select.txt`,
for rules that act only together with others). A case without `.out.py` must stay byte-identical
(a negative: a look-alike the rule must not touch). `<case>.findings.txt`, when present, pins the
findings as `line:col RULE fixed|open` lines. Every case is also checked for idempotency.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from npu_migrate.pipeline import migrate_text
from npu_migrate.registry import all_rules

RULES_DIR = FIXTURES / "rules"
CASES = sorted(RULES_DIR.glob("*/*.in.*"))


def _stem(case):
    return case.name.split(".in.")[0]


def _companion(case, suffix):
    """`<case>.out.<ext>` or `<case>.findings.txt` next to `<case>.in.<ext>`."""
    ext = case.name.split(".in.", 1)[1]
    return case.with_name(f"{_stem(case)}.out.{ext}" if suffix == "out" else f"{_stem(case)}.findings.txt")


def _findings_text(findings) -> str:
    return "".join(f"{f.line}:{f.col} {f.rule_id} {'fixed' if f.fixed else 'open'}\n" for f in findings)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_fixture(case, update_fixtures):
    rule_id = case.parent.name
    select_file = case.parent / "select.txt"
    select = select_file.read_text().strip().split(",") if select_file.exists() else [rule_id]
    source = case.read_text(encoding="utf-8")
    out_path = _companion(case, "out")
    findings_path = _companion(case, "findings")
    name = case.name.replace(".in.", ".", 1)  # the kind comes from the real file name: train.sh, Dockerfile

    migrated, findings = migrate_text(source, path=name, select=select)
    if update_fixtures:
        if migrated != source:
            out_path.write_text(migrated, encoding="utf-8")
        if findings or findings_path.exists():
            findings_path.write_text(_findings_text(findings), encoding="utf-8")

    expected = out_path.read_text(encoding="utf-8") if out_path.exists() else source
    assert migrated == expected
    if findings_path.exists():
        assert _findings_text(findings) == findings_path.read_text(encoding="utf-8")
    again, _ = migrate_text(migrated, path=name, select=select)
    assert again == migrated, "a second apply must change nothing"


# The analysis rules (NPU9xx) are not `apply`'s: the analyze tests' project and their doc examples cover them.
@pytest.mark.parametrize("rule", [r for r in all_rules() if "analysis" not in r.tags], ids=lambda r: r.id)
def test_every_rule_has_positive_and_negative_fixtures(rule):
    folder = RULES_DIR / rule.id
    cases = sorted(folder.glob("*.in.*"))
    assert cases, f"no fixtures for {rule.id} in {folder}"
    stems = [_stem(c) for c in cases]
    assert len(stems) == len(set(stems)), f"two cases in {folder} share a name, and so a .findings.txt"
    positives = [c for c in cases if _companion(c, "out").exists()]
    negatives = [c for c in cases if c not in positives]
    if rule.fixable:
        assert positives, f"{rule.id} rewrites code but has no .out.py fixture"
    else:
        assert any(_companion(c, "findings").exists() for c in cases), (
            f"{rule.id} only reports, so a fixture must pin its findings"
        )
    assert negatives, f"{rule.id} has no negative fixture (a look-alike that must stay untouched)"
