"""The fused idioms' declarations (`Idiom`) are the only registration, and they hold.

An idiom is its module's `IDIOM`, its templates, the reference op of each kernel it names and its
fixtures: these tests check that each of those agrees with the declaration, so a new idiom that forgets
one fails here rather than being silently skipped.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from conftest import FIXTURES

import npu_migrate.templates as templates
from npu_migrate.engine.registry import rules_tagged
from npu_migrate.engine.rule import Rule
from npu_migrate.transforms import fused
from npu_migrate.transforms.fused import IDIOMS, FusedOpsChecker, _helper_names
from npu_migrate.transforms.fused.idiom import Idiom

TEMPLATES = Path(templates.__file__).parent
_KERNEL_CALL = re.compile(r"torch_npu\.(npu_\w+)\s*\(")


def _modules():
    return [importlib.import_module(f"{fused.__name__}.{m.name}") for m in pkgutil.iter_modules(fused.__path__)]


def test_every_rule_of_the_package_is_a_registered_idiom_s():
    # An idiom's parts may live in modules of their own (rotary_rule.py holds NPU703's rule, rotary.py its
    # IDIOM): every rule any module of the package holds is the rule of an IDIOM the checker registered.
    rules = {v.id for m in _modules() for v in vars(m).values() if isinstance(v, Rule)}
    assert len(rules) >= 4
    assert rules == {i.rule.id for i in IDIOMS}
    for module in _modules():
        if hasattr(module, "IDIOM"):
            assert isinstance(module.IDIOM, Idiom) and module.IDIOM in IDIOMS, module.__name__
    assert [i.rule.id for i in IDIOMS] == sorted(i.rule.id for i in IDIOMS)
    assert FusedOpsChecker.rules == tuple(dict.fromkeys(i.rule for i in IDIOMS))
    # What `fused = {...}` in the configuration and analyze's affinity report select by: exactly the idioms.
    assert set(rules_tagged("fused")) == {i.rule for i in IDIOMS}


@pytest.mark.integration
def test_every_kernel_an_idiom_names_has_a_reference_op():
    from npu_migrate.verify import reference  # imports torch: only this test needs it

    for idiom in IDIOMS:
        assert idiom.kernels and set(idiom.kernels) <= set(reference.OPS), idiom.rule.id


@pytest.mark.parametrize("idiom", IDIOMS, ids=lambda i: i.rule.id)
def test_fixtures_call_exactly_the_kernels_the_idiom_names(idiom):
    outputs = sorted((FIXTURES / "rules" / idiom.rule.id).glob("*.out.py"))
    assert outputs, f"{idiom.rule.id} has no fixture with a rewrite"
    emitted = {kernel for path in outputs for kernel in _KERNEL_CALL.findall(path.read_text(encoding="utf-8"))}
    assert emitted == set(idiom.kernels)


def test_every_fused_template_is_declared_and_every_declared_one_exists():
    declared = {fused.PRELUDE, *fused.HELPER_NAMES}
    declared |= {i.template for i in IDIOMS if i.template is not None} | {t for i in IDIOMS for t in i.templates}
    assert all((TEMPLATES / name).is_file() for name in declared)
    # guard.j2 is the macro the branch templates import, not rendered on its own; module_header.py.j2 opens
    # a package's helper module (`helper_modules`), no idiom's helper.
    on_disk = {f"fused/{p.name}" for p in (TEMPLATES / "fused").iterdir() if p.suffix == ".j2"}
    assert on_disk - declared == {"fused/guard.j2", "fused/module_header.py.j2"}


def test_helper_names_are_what_the_templates_define():
    for template, name in fused.HELPER_NAMES.items():
        assert re.search(rf"^(def|class) {name}\b", (TEMPLATES / template).read_text(encoding="utf-8"), re.M), template


def test_a_helper_template_declared_twice_with_different_names_is_an_error():
    first = IDIOMS[0]
    clash = Idiom(first.rule, ("x",), ("x",), ("npu_x",), first.match, helpers={fused.PRELUDE: "_something_else"})
    with pytest.raises(ValueError, match="_is_npu and _something_else"):
        _helper_names((first, clash))


def test_a_call_idiom_needs_its_matcher_and_its_fix():
    first = IDIOMS[0]
    with pytest.raises(ValueError, match="go together"):
        Idiom(first.rule, ("x",), ("x",), ("npu_x",), first.match, calls=("torch.f",))


@pytest.mark.parametrize(
    "words, wanted",
    [
        ({"rsqrt"}, True),
        ({"sqrt"}, False),  # `sqrt(d)` in an attention file: RMSNorm needs the mean too
        ({"sqrt", "mean"}, True),
        ({"cos"}, False),
        ({"cos", "sin"}, True),
        ({"polar"}, True),
        ({"act"}, True),
        ({"softmax"}, True),
        ({"torch", "cuda", "mean"}, False),
    ],
)
def test_identifier_groups_need_all_their_names(words, wanted):
    assert FusedOpsChecker.wants_words(frozenset(words)) is wanted
