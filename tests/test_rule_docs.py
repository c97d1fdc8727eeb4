"""Issue #15: one registry of every rule, each rule documented in one shape, its examples run as tests.

Every rule's example (`Rule.example`) is executed, as Fixit runs its rules' VALID / INVALID cases: a
rewrite rule's `before` must become exactly its `after` with only that rule (and NPU001, where the
rule needs `import torch_npu`) selected; a report-only rule's must stay as it is and be reported; an
analysis rule's must be reported by `npu-migrate analyze --mode all`. `Rule.valid` cases must be left
alone and unreported. So the documentation cannot drift from what the code does.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from npu_migrate.analyze.rules import RULES as ANALYSIS_RULES
from npu_migrate.cli.app import app
from npu_migrate.engine.pipeline import migrate_text
from npu_migrate.engine.registry import (
    TAGS,
    Registry,
    RegistryError,
    all_checkers,
    all_rules,
    fused_rule_names,
    rule,
    rules_tagged,
    select_rules,
    text_checkers,
)
from npu_migrate.engine.rule import Example, FixSafety
from npu_migrate.output.rule_examples import FOLDED_HELPERS, fold_helpers
from npu_migrate.transforms.fused import FusedOpsChecker

RULES = all_rules()
ANALYSIS = [r for r in RULES if "analysis" in r.tags]
CODEMOD = [r for r in RULES if "analysis" not in r.tags]


def _id(r):
    return r.id


# --- the registry --------------------------------------------------------------------------------------


def test_a_second_rule_with_an_existing_id_is_an_error():
    first, second = RULES[0], RULES[1]
    with pytest.raises(RegistryError, match=f"two rules have the id '{first.id}'"):
        Registry([first, replace(second, id=first.id)])


def test_a_second_rule_with_an_existing_name_is_an_error():
    first, second = RULES[0], RULES[1]
    with pytest.raises(RegistryError, match=f"two rules have the name '{first.name}'"):
        Registry([first, replace(second, name=first.name)])


def test_one_declaration_serving_two_checkers_counts_once():
    # NPU102 is both the device checker's and the launch scripts' (`--device cuda`).
    device_string = rule("NPU102")
    users = [c for c in [*all_checkers(), *text_checkers()] if device_string in c.rules]
    assert len(users) == 2
    assert Registry([device_string, device_string]).rules == (device_string,)


def test_unknown_tags_and_unexplained_reviews_are_errors():
    some = rule("NPU101")
    with pytest.raises(RegistryError, match="unknown tags"):
        Registry([replace(some, tags=frozenset({"fusd"}))])
    with pytest.raises(RegistryError, match="does not say what to review"):
        Registry([replace(some, fix_safety=FixSafety.NEEDS_REVIEW, review="")])


def test_the_registry_holds_every_checker_rule_and_every_analysis_rule():
    declared = {r.id for c in [*all_checkers(), *text_checkers()] for r in c.rules}
    assert {r.id for r in CODEMOD} == declared
    assert ANALYSIS == sorted(ANALYSIS_RULES, key=_id)
    assert all(r.id.startswith("NPU9") for r in ANALYSIS)


def test_tags_are_what_the_declarations_say():
    assert set(rules_tagged("fused")) == set(FusedOpsChecker.rules)
    assert fused_rule_names() == {r.name: r.id for r in FusedOpsChecker.rules}
    assert [r.id for r in rules_tagged("precision")] == ["NPU204", "NPU951", "NPU952"]
    assert [r.id for r in rules_tagged("performance")] == ["NPU305", "NPU921", "NPU931", "NPU941", "NPU942"]
    with pytest.raises(KeyError):
        rules_tagged("no-such-tag")


def test_select_reaches_the_analysis_rules():
    assert select_rules(["NPU9"]) == {r.id for r in ANALYSIS}
    assert "NPU941" not in select_rules(None, ["NPU941"])


def test_apply_accepts_an_analysis_rule_prefix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(2).cuda()\n")
    result = CliRunner().invoke(app, ["apply", "--diff", "--select", "NPU9", "train.py"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # no apply rule selected: nothing to rewrite


def test_sarif_describes_every_rule_of_the_registry():
    from npu_migrate.output.report import sarif_document

    descriptors = sarif_document([])["runs"][0]["tool"]["driver"]["rules"]
    assert [d["id"] for d in descriptors] == [r.id for r in RULES]
    for d, r in zip(descriptors, RULES):
        assert d["fullDescription"]["text"] == r.documentation
        assert d["properties"]["fixSafety"] == r.fix_safety.value
        assert set(d["properties"]["tags"]) == {r.family, *r.tags}


# --- the documentation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("r", RULES, ids=_id)
def test_every_rule_has_every_doc_field(r):
    assert re.fullmatch(r"NPU\d{3}", r.id)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r.name)
    for field in ("family", "summary", "what", "why"):
        assert getattr(r, field).strip(), f"{r.id} has no {field}"
    assert r.tags <= TAGS.keys()
    assert r.example.before.strip()
    if r.fixable:
        assert r.example.after is not None and r.example.after != r.example.before, "a rewrite needs a rewrite"
    else:
        assert r.example.after is None, "a report-only rule's example is left as it is"
        assert r.example.reports.strip(), "a report-only rule's example says what it reports"
    assert bool(r.review.strip()) == (r.fix_safety is FixSafety.NEEDS_REVIEW)
    assert "analysis" not in r.tags or r.fix_safety is FixSafety.REPORT_ONLY
    text = r.documentation
    for section in ("What it does:", "Why:", f"Example ({r.example.path}", f"Fix safety: {r.fix_safety.value}."):
        assert section in text


@pytest.mark.parametrize("r", RULES, ids=_id)
def test_every_rule_is_documented_by_rules_id(r, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml above: every rule is enabled
    for key in (r.id, r.id.lower(), r.name):
        result = CliRunner().invoke(app, ["rules", key])
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith(f"{r.id} ({r.name}): {r.summary}\n")
        assert f"fix: {r.fix_safety.value}" in result.stdout
        assert r.documentation in result.stdout


def test_the_rules_list_shows_family_targets_and_fix_safety(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["rules"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(RULES)
    for r, line in zip(RULES, lines):
        targets = ",".join(sorted(r.targets))
        # the default target is npu; ALL does not select an opt-in rule (NPU707, NPU411): its id does
        state = "on" if "npu" in r.targets and "opt-in" not in r.tags else "off"
        assert line.split()[:5] == [r.id, state, r.family, targets, r.fix_safety.value.split()[0]], line


def test_the_rules_list_says_which_rules_act_in_the_portable_target(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["rules", "--target", "portable"])
    assert result.exit_code == 0, result.output
    states = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()}
    # NPU-only rewrites (torch.npu.matmul.allow_hf32, nvidia-smi -> npu-smi) are off; shared ones and the
    # portable target's own (NPU002) on.
    assert states["NPU501"] == states["NPU605"] == "off"
    assert states["NPU101"] == states["NPU201"] == states["NPU601"] == states["NPU701"] == states["NPU002"] == "on"
    assert {r.id for r in RULES if "portable" in r.targets and "opt-in" not in r.tags} == {
        i for i, s in states.items() if s == "on"
    }


def test_an_opt_in_rule_is_selected_by_its_id_or_the_fused_table_never_by_a_prefix(tmp_path, monkeypatch):
    from npu_migrate.engine.registry import select_rules

    assert "NPU707" not in select_rules() and "NPU707" not in select_rules(["NPU7"])
    assert "NPU707" in select_rules(["NPU7", "NPU707"]) and "NPU707" not in select_rules(["NPU707"], ["NPU70"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.npu-migrate]\nfused = { fused-sdpa = true }\n")
    states = {line.split()[0]: line.split()[1] for line in CliRunner().invoke(app, ["rules"]).stdout.splitlines()}
    assert states["NPU707"] == states["NPU704"] == "on"


# --- the examples, executed --------------------------------------------------------------------------------


def _apply(r, text: str, path: str, with_rules=()):
    select = [r.id, *with_rules, *(["NPU001"] if r.needs_torch_npu else [])]
    # A rule of one target only (NPU002: the portable target's) is documented in that target.
    target = "npu" if "npu" in r.targets else "portable"
    return migrate_text(text, path=path, select=select, target=target, torch_npu_version=r.example.torch_npu_version)


def _analyze(example: Example, text: str, tmp_path) -> list[dict]:
    project = tmp_path / "project"
    (project / example.path).parent.mkdir(parents=True)
    (project / example.path).write_text(text, encoding="utf-8")
    args = ["analyze", str(project), "--mode", "all", "--format", "json"]
    if example.library:
        library = tmp_path / "library"
        for path, source in example.library:
            (library / path).parent.mkdir(parents=True, exist_ok=True)
            (library / path).write_text(source, encoding="utf-8")
        args += ["--env-path", str(library)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["findings"]


@pytest.mark.parametrize("r", CODEMOD, ids=_id)
def test_the_example_does_what_the_documentation_says(r):
    example = r.example
    migrated, findings = _apply(r, example.before, example.path, example.with_rules)
    ours = [f for f in findings if f.rule_id == r.id]
    assert any(example.reports in f.message for f in ours), [f.message for f in ours]
    if example.after is None:
        assert migrated == example.before
    else:
        assert fold_helpers(migrated) == example.after
        assert any(f.fixed for f in ours)
        assert _apply(r, migrated, example.path, example.with_rules)[0] == migrated, "a second apply changes nothing"


def test_an_example_shows_the_fused_helpers_it_adds_as_one_line_naming_them():
    attention = rule("NPU707")
    migrated, _ = _apply(attention, attention.example.before, attention.example.path)
    assert "def _npu_fusion_sdpa(" in migrated and len(migrated.splitlines()) > 60  # what is folded
    folded = fold_helpers(migrated)
    named = "import torch_npu (guarded), _is_npu, _npu_sdpa, _sdpa_enable_gqa, _npu_causal_mask, _npu_fusion_sdpa"
    assert FOLDED_HELPERS.format(named) in folded.splitlines()
    # Only the helpers are folded: the imports above them and the renamed call below stay line for line.
    assert folded.splitlines()[:4] == migrated.splitlines()[:4]
    assert folded.endswith("\n\n\ndef attend(q, k, v, mask):\n    return _npu_sdpa(q, k, v, attn_mask=mask)\n")
    # The call site still decides: an example whose rewrite differs fails.
    assert fold_helpers(migrated.replace("_npu_sdpa(q, k", "_npu_sdpa(k, q")) != attention.example.after
    text = "import torch\n\n\ndef _is_npu(x):\n    return False\n"  # the user's own, not the helpers
    assert fold_helpers(text) == text


@pytest.mark.parametrize("r", [r for r in CODEMOD if "fused" in r.tags], ids=_id)
def test_a_fused_rules_documentation_shows_the_call_site_not_the_helpers(r):
    assert r.example.after.count(FOLDED_HELPERS.format("")) == 1
    assert "def _is_npu(" not in r.documentation and "torch_npu = None" not in r.documentation


@pytest.mark.parametrize("r", ANALYSIS, ids=_id)
def test_the_analysis_example_is_reported(r, tmp_path):
    findings = _analyze(r.example, r.example.before, tmp_path)
    ours = [f for f in findings if f["rule"] == r.id and f["path"] == r.example.path]
    assert any(r.example.reports in f["message"] for f in ours), findings


VALID = [(r, i) for r in RULES for i in range(len(r.valid))]


@pytest.mark.parametrize(("r", "index"), VALID, ids=[f"{r.id}-{i}" for r, i in VALID])
def test_valid_code_is_left_alone(r, index, tmp_path):
    text = r.valid[index]
    if "analysis" in r.tags:
        assert not [f for f in _analyze(r.example, text, tmp_path) if f["rule"] == r.id]
        return
    migrated, findings = _apply(r, text, r.example.path, r.example.with_rules)
    assert migrated == text
    assert not [f for f in findings if f.rule_id == r.id]
