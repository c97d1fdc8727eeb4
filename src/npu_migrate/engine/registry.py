"""Every rule in one registry: `apply`'s (the checkers of `npu_migrate.transforms`) and `analyze`'s (NPU9xx,
declared in `npu_migrate.analyze.rules`), and choosing among them with `--select` / `--ignore` (ids or
prefixes, like ruff).

Callers pick rules by what the declarations say (`Rule.family`, `Rule.tags`), never by id ranges or
module paths. Importing this module loads the rule declarations and the codemod's checkers, not the
analysis engine: `apply --check` in a pre-commit hook pays for what it runs, and no more.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from npu_migrate.analyze.rules import RULES as ANALYSIS_RULES
from npu_migrate.engine.checkers import Checker, TextChecker
from npu_migrate.engine.rule import FixSafety, Rule
from npu_migrate.program.api import DEFAULT_TARGET
from npu_migrate.transforms import CHECKERS, TEXT_CHECKERS
from npu_migrate.transforms.torch_npu_import import IMPORT_TORCH_NPU

#: The tags a rule may carry, and what each means to the code that selects by it.
TAGS = {
    "fused": "injects a guarded torch_npu fused-operator branch; `fused = {...}` in the configuration names these",
    "analysis": "found by `npu-migrate analyze` only: no checker of `apply` reports it",
    "precision": "advice about numerics (analyze's api_precision_advice.csv)",
    "performance": "advice about speed (analyze's api_performance_advice.csv; fused-operator sites count too)",
    "lever": "a training speed lever (issue #24): analyze lists its sites as applied, available or declined",
    "opt-in": "off unless selected by its exact id (or named true in `fused = {...}`): ALL and prefixes "
    "skip it, since it may change the last bits of results or adds code few need",
}


class RegistryError(ValueError):
    """Rule declarations that contradict each other: two rules with one id or one name, an unknown tag."""


class SelectionError(ValueError):
    pass


class Registry:
    """A set of rules with unique ids and names, sorted by id."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        by_id: dict[str, Rule] = {}
        by_name: dict[str, Rule] = {}
        # One declaration may serve several checkers (NPU102 is also the launch scripts' `--device cuda`);
        # only a second declaration is a conflict.
        for rule in {id(r): r for r in rules}.values():
            for key, seen, kind in ((rule.id, by_id, "id"), (rule.name, by_name, "name")):
                if key in seen:
                    raise RegistryError(
                        f"two rules have the {kind} {key!r}: {seen[key].summary!r} and {rule.summary!r}"
                    )
                seen[key] = rule
            unknown = rule.tags - TAGS.keys()
            if unknown:
                raise RegistryError(f"{rule.id} has unknown tags {sorted(unknown)}; known: {sorted(TAGS)}")
            if rule.fix_safety is FixSafety.NEEDS_REVIEW and not rule.review.strip():
                raise RegistryError(f"{rule.id} needs review but does not say what to review (Rule.review)")
        self.rules: tuple[Rule, ...] = tuple(sorted(by_id.values(), key=lambda r: r.id))
        self._by_id = by_id
        self._by_name = by_name

    def get(self, key: str) -> Rule:
        """The rule with this id (any case) or name; KeyError if there is none."""
        found = self._by_id.get(key.upper()) or self._by_name.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def tagged(self, tag: str) -> tuple[Rule, ...]:
        if tag not in TAGS:
            raise KeyError(f"unknown tag {tag!r}; known: {sorted(TAGS)}")
        return tuple(r for r in self.rules if tag in r.tags)

    def select(
        self, select: list[str] | None = None, ignore: list[str] | None = None, target: str = DEFAULT_TARGET
    ) -> frozenset[str]:
        """Ids of the selected rules that act in `target`. Unknown codes are an error that lists the known ones."""
        select = [c.strip().upper() for c in (select or ["ALL"]) if c.strip()]
        ignore = [c.strip().upper() for c in (ignore or []) if c.strip()]
        for code in (*select, *ignore):
            if not any(_matches(r, code) for r in self.rules):
                raise SelectionError(f"unknown rule or prefix {code!r}; `npu-migrate rules` lists them")
        return frozenset(
            r.id
            for r in self.rules
            if target in r.targets
            and any(_matches(r, c) for c in select)
            and not any(_matches(r, c) for c in ignore)
            and ("opt-in" not in r.tags or r.id in select)
        )


def _matches(rule: Rule, code: str) -> bool:
    return code == "ALL" or rule.id.startswith(code)


@functools.cache
def registry() -> Registry:
    """The rules of this installation: every checker's, and the analysis rules."""
    return Registry([*(r for c in (*CHECKERS, *TEXT_CHECKERS) for r in c.rules), *ANALYSIS_RULES])


def all_checkers() -> list[type[Checker]]:
    return list(CHECKERS)


def text_checkers() -> list[type[TextChecker]]:
    return list(TEXT_CHECKERS)


def all_rules() -> list[Rule]:
    """Every rule, `apply`'s and `analyze`'s, by id."""
    return list(registry().rules)


def rule(key: str) -> Rule:
    """The rule with this id or name (KeyError if none)."""
    return registry().get(key)


def rules_tagged(tag: str) -> tuple[Rule, ...]:
    return registry().tagged(tag)


def family_of(rule_id: str) -> str:
    return registry().get(rule_id).family


def select_rules(
    select: list[str] | None = None, ignore: list[str] | None = None, target: str = DEFAULT_TARGET
) -> frozenset[str]:
    return registry().select(select, ignore, target)


def with_torch_npu_import(enabled: frozenset[str], ignore: list[str]) -> frozenset[str]:
    """`enabled`, plus NPU001 when a rule in it writes code that needs torch_npu and NPU001 is not
    ignored: `--select NPU1` alone must not write `torch.npu` calls into a file that never imports it."""
    rules = {r.id: r for r in registry().rules}
    ignored = any(_matches(IMPORT_TORCH_NPU, c.strip().upper()) for c in ignore)
    if ignored or not any(rules[i].needs_torch_npu for i in enabled if i in rules):
        return enabled
    return enabled | {IMPORT_TORCH_NPU.id}


def fused_rule_names() -> dict[str, str]:
    """Rule name -> id for the fused-operator rules, which `fused = {...}` in the configuration names."""
    return {r.name: r.id for r in rules_tagged("fused")}
