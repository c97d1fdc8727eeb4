"""Issue #25: a declined fused rewrite says what would make it apply, or that nothing in the user's code
can (`Outcome.remedy`, joined to the message by the fused checker), in the same sentence as why."""

from __future__ import annotations

import re

import pytest
from conftest import FIXTURES

from npu_migrate.engine.pipeline import migrate_text

CASES = sorted(FIXTURES.glob("rules/NPU70*/*.in.py"))
DECLINE = re.compile(r" not (fused|rewritten|injected|wrapped)\b")


def _declines(case):
    findings = migrate_text(case.read_text(encoding="utf-8"), path=case.name.replace(".in.", ".", 1), select=["NPU70"])[
        1
    ]
    return [f for f in findings if not f.fixed and DECLINE.search(f.message)]


def test_the_fixtures_decline_something():
    assert sum(len(_declines(case)) for case in CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_declined_fused_rewrite_says_what_would_let_it_apply(case):
    for finding in _declines(case):
        message = finding.message
        assert "; to fuse it, " in message or "; nothing in the code can: " in message, message
        assert message.count("; to fuse it, ") + message.count("; nothing in the code can: ") == 1, message
