"""Fixture pairs, one folder per rule: `fixtures/rules/<RULE>/<case>.in.py` -> `<case>.out.py` (or
`.in.sh` -> `.out.sh`, `.in.ipynb` -> `.out.ipynb`, ...: the name without `.in` decides the file kind).

Each case runs with only its folder's rule selected (or the rules listed in the folder's `select.txt`,
for rules that act only together with others), for the torch_npu version in the folder's `version.txt` if
there is one (the default otherwise). A case without `.out.py` must stay byte-identical
(a negative: a look-alike the rule must not touch). `<case>.findings.txt`, when present, pins the
findings as `line:col RULE fixed|open` lines. Every case is also checked for idempotency.

A case also runs for `--target portable` when `<case>.portable.findings.txt` is there (empty when it finds
nothing): it becomes `<case>.portable.out.<ext>`, or stays byte-identical when there is none. The same input
serves both targets, so a fixture shows what each makes of the same code.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.engine.registry import all_rules

RULES_DIR = FIXTURES / "rules"
CASES = sorted(RULES_DIR.glob("*/*.in.*"))


def _stem(case):
    return case.name.split(".in.")[0]


def _companion(case, suffix, target="npu"):
    """`<case>.out.<ext>` or `<case>.findings.txt` next to `<case>.in.<ext>` (`<case>.portable.out.<ext>` ...
    for the portable target)."""
    ext = case.name.split(".in.", 1)[1]
    stem = _stem(case) if target == "npu" else f"{_stem(case)}.{target}"
    return case.with_name(f"{stem}.out.{ext}" if suffix == "out" else f"{stem}.findings.txt")


PORTABLE_CASES = [c for c in CASES if _companion(c, "findings", "portable").exists()]


def _findings_text(findings) -> str:
    return "".join(f"{f.line}:{f.col} {f.rule_id} {'fixed' if f.fixed else 'open'}\n" for f in findings)


def _check_case(case, update_fixtures, target):
    rule_id = case.parent.name
    select_file = case.parent / "select.txt"
    select = select_file.read_text().strip().split(",") if select_file.exists() else [rule_id]
    source = case.read_text(encoding="utf-8")
    out_path = _companion(case, "out", target)
    findings_path = _companion(case, "findings", target)
    name = case.name.replace(".in.", ".", 1)  # the kind comes from the real file name: train.sh, Dockerfile

    version_file = case.parent / "version.txt"  # a rule that acts only for some torch_npu versions
    version = version_file.read_text().strip() if version_file.exists() else None
    migrated, findings = migrate_text(source, path=name, select=select, target=target, torch_npu_version=version)
    if update_fixtures:
        if migrated != source:
            out_path.write_text(migrated, encoding="utf-8")
        if findings or findings_path.exists():
            findings_path.write_text(_findings_text(findings), encoding="utf-8")

    expected = out_path.read_text(encoding="utf-8") if out_path.exists() else source
    assert migrated == expected
    if findings_path.exists():
        assert _findings_text(findings) == findings_path.read_text(encoding="utf-8")
    again, _ = migrate_text(migrated, path=name, select=select, target=target, torch_npu_version=version)
    assert again == migrated, "a second apply must change nothing"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_fixture(case, update_fixtures):
    _check_case(case, update_fixtures, "npu")


@pytest.mark.parametrize("case", PORTABLE_CASES, ids=[f"{c.parent.name}/{c.name}" for c in PORTABLE_CASES])
def test_portable_fixture(case, update_fixtures):
    _check_case(case, update_fixtures, "portable")


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


@pytest.mark.parametrize("rule", [r for r in all_rules() if "portable" in r.targets and r.fixable], ids=lambda r: r.id)
def test_every_portable_rewrite_has_a_portable_fixture(rule):
    """A rule that acts in the portable target shows what it does there on a fixture: its rewrite, or (NPU601,
    which renames nothing there) its findings. The fused branches, the same in both targets, are checked by
    `test_fused_branches_are_the_same_in_both_targets`."""
    if "fused" in rule.tags:
        return
    cases = [c for c in PORTABLE_CASES if c.parent.name == rule.id]
    shown = [
        c
        for c in cases
        if _companion(c, "out", "portable").exists() or _companion(c, "findings", "portable").stat().st_size
    ]
    assert shown, f"no portable fixture for {rule.id} (a rewrite, or the findings of what it leaves for a human)"


FUSED_CASES = [c for c in CASES if any(r.id == c.parent.name for r in all_rules() if "fused" in r.tags)]


@pytest.mark.parametrize("case", FUSED_CASES, ids=[f"{c.parent.name}/{c.name}" for c in FUSED_CASES])
def test_fused_branches_are_the_same_in_both_targets(case):
    select_file = case.parent / "select.txt"
    select = select_file.read_text().strip().split(",") if select_file.exists() else [case.parent.name]
    source = case.read_text(encoding="utf-8")
    name = case.name.replace(".in.", ".", 1)
    assert (
        migrate_text(source, path=name, select=select, target="portable")[0]
        == migrate_text(source, path=name, select=select)[0]
    )
