"""All rules, and choosing among them with `--select` / `--ignore` (ids or prefixes, like ruff)."""

from __future__ import annotations

from npu_migrate.rule import Checker, Rule, TextChecker


class SelectionError(ValueError):
    pass


def all_checkers() -> list[type[Checker]]:
    from npu_migrate.transforms import CHECKERS

    return list(CHECKERS)


def text_checkers() -> list[type[TextChecker]]:
    from npu_migrate.transforms import TEXT_CHECKERS

    return list(TEXT_CHECKERS)


def all_rules() -> list[Rule]:
    rules = {rule.id: rule for checker in [*all_checkers(), *text_checkers()] for rule in checker.rules}
    return sorted(rules.values(), key=lambda r: r.id)


def family_of(rule_id: str) -> str:
    for checker in [*all_checkers(), *text_checkers()]:
        if any(r.id == rule_id for r in checker.rules):
            return checker.family()
    raise KeyError(rule_id)


def _matches(rule: Rule, code: str) -> bool:
    return code == "ALL" or rule.id.startswith(code)


def select_rules(select: list[str] | None = None, ignore: list[str] | None = None) -> frozenset[str]:
    """Ids of the selected rules. Unknown codes are an error that lists the known ones."""
    rules = all_rules()
    select = [c.strip().upper() for c in (select or ["ALL"]) if c.strip()]
    ignore = [c.strip().upper() for c in (ignore or []) if c.strip()]
    for code in (*select, *ignore):
        if not any(_matches(r, code) for r in rules):
            raise SelectionError(f"unknown rule or prefix {code!r}; `npu-migrate rules` lists them")
    return frozenset(
        r.id for r in rules if any(_matches(r, c) for c in select) and not any(_matches(r, c) for c in ignore)
    )


def split_codes(values: list[str] | None) -> list[str]:
    """`--select NPU1,NPU201 --select NPU3` -> ["NPU1", "NPU201", "NPU3"]."""
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


def fused_rule_names() -> dict[str, str]:
    """Rule name -> id for the fused-operator family, which `fused = {...}` in the configuration names."""
    return {
        rule.name: rule.id
        for checker in all_checkers()
        if checker.__module__.startswith("npu_migrate.transforms.fused")
        for rule in checker.rules
    }
