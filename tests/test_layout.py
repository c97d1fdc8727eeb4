"""Generated code is laid out as the file's own: within its width, split black's way, double quotes."""

from __future__ import annotations

import ast
import difflib
import re
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES

from npu_migrate.engine.layout import NARROWEST, fit, line_width
from npu_migrate.engine.registry import rule
from npu_migrate.transforms.fused import HELPER_NAMES
from npu_migrate.transforms.fused.helpers import PRELUDE, helper_code, module_text

BRANCH = (
    "if _is_npu(hidden_states) and hidden_states.dim() >= 2 and self.weight.dtype == hidden_states.dtype:\n"
    "    return _npu_rms_norm(hidden_states, self.weight, epsilon=self.variance_epsilon)[0]\n"
)


def test_the_width_is_the_longest_line_within_pep8_and_120():
    assert line_width("x = 1\n") == 79
    assert line_width("y = '" + "a" * 90 + "'\n") == 96
    assert line_width("z = '" + "a" * 200 + "'\n") == 120
    assert line_width("x = 1\n", configured=88) == 88


def test_a_branch_that_fits_stays_on_its_lines():
    assert fit(BRANCH, 120) == BRANCH


def test_a_long_condition_goes_one_operand_a_line_and_a_long_call_one_argument_set_a_line():
    laid = fit(BRANCH, 79)
    assert laid == (
        "if (\n"
        "    _is_npu(hidden_states)\n"
        "    and hidden_states.dim() >= 2\n"
        "    and self.weight.dtype == hidden_states.dtype\n"
        "):\n"
        "    return _npu_rms_norm(\n"
        "        hidden_states, self.weight, epsilon=self.variance_epsilon\n"
        "    )[0]\n"
    )
    assert max(len(line) for line in laid.splitlines()) <= 79
    assert ast.dump(ast.parse(laid)) == ast.dump(ast.parse(BRANCH))


def test_what_follows_a_split_call_on_its_line_counts_toward_the_width():
    # 82 columns flat; the call alone would fit 80, its `[0]` would not.
    code = "return _npu_rms_norm(hidden_states, self.weight, epsilon=self.variance_epsilon)[0]\n"
    assert fit(code, 80) == (
        "return _npu_rms_norm(\n    hidden_states, self.weight, epsilon=self.variance_epsilon\n)[0]\n"
    )
    assert fit("return f(x, y)[0].to(dtype)\n", 20) == "return f(\n    x, y\n)[0].to(dtype)\n"


def test_a_condition_s_operands_count_their_and_and_a_long_comparison_goes_on_two_lines():
    code = "if _is_npu(x) and f(a_first_argument, a_second_argument, third=3):\n    return x\n"
    # "    and f(...)" is 56 columns: at 54 the call splits, though the operand alone is 52.
    assert fit(code, 54).splitlines()[2:5] == [
        "    and f(",
        "        a_first_argument, a_second_argument, third=3",
        "    )",
    ]
    code = "if _is_npu(x) and x.dtype in (torch.float16, torch.bfloat16, torch.float32):\n    return x\n"
    laid = fit(code, 56)
    assert laid.splitlines()[2:4] == ["    and x.dtype", "    in (torch.float16, torch.bfloat16, torch.float32)"]
    assert ast.dump(ast.parse(laid)) == ast.dump(ast.parse(code))


def test_unparsed_strings_get_double_quotes_unless_that_needs_escaping():
    assert fit("f(x, mode='half', s='say \"hi\"')\n", 120) == 'f(x, mode="half", s=\'say "hi"\')\n'


def test_the_indentation_unit_is_the_files():
    laid = fit("if a:\n  return f(" + ", ".join(f"argument_{i}" for i in range(12)) + ")\n", 60, indent="  ")
    assert laid.splitlines()[1] == "  return f("
    assert laid.splitlines()[2].startswith("    argument_0,")


# -- the injected helpers ---------------------------------------------------------------------------------

#: Every `<case>.in.py` fixture of a fused rule with a pinned output, for either target.
_PAIRS = [
    (case, case.with_name(case.name.replace(".in.py", out)))
    for case in sorted((FIXTURES / "rules").glob("*/*.in.py"))
    if "fused" in rule(case.parent.name).tags
    for out in (".out.py", ".portable.out.py")
    if case.with_name(case.name.replace(".in.py", out)).exists()
]


def _added_lines(before: str, after: str) -> list[str]:
    old, new = before.splitlines(), after.splitlines()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [line for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert") for line in new[j1:j2]]


@pytest.mark.parametrize("pair", _PAIRS, ids=[p[1].relative_to(FIXTURES / "rules").as_posix() for p in _PAIRS])
def test_every_line_the_engine_adds_fits_the_files_width(pair):
    case, out = pair
    before, after = case.read_text(encoding="utf-8"), out.read_text(encoding="utf-8")
    width = line_width(before)
    wide = [line for line in _added_lines(before, after) if len(_without_pragma(line)) > width]
    assert not wide, f"wider than {width} columns:\n" + "\n".join(wide)


#: A trailing comment for a linter or type checker, carried over from the user's own line.
_PRAGMA = re.compile(r"\s+#\s*(noqa|type:\s*ignore|pylint:|pyright:|mypy:|nosec)[^#]*$")


def _without_pragma(line: str) -> str:
    """`line` as ruff's E501 measures it: a trailing pragma comment that starts within the width is not
    counted (docs.astral.sh/ruff/rules/line-too-long, exception 3)."""
    return _PRAGMA.sub("", line)


def test_every_helper_fits_pep8_s_width_in_a_file_and_in_the_helper_module():
    templates = [t for t in HELPER_NAMES if t != PRELUDE]
    texts = [module_text(None, [PRELUDE, *templates]), helper_code([PRELUDE, *templates], import_torch_npu=False)]
    for text in texts:
        wide = [line for line in text.splitlines() if len(line) > NARROWEST]
        assert not wide, f"wider than {NARROWEST} columns:\n" + "\n".join(wide)


def test_the_written_helper_module_fits_pep8_s_width(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(FIXTURES / "projects" / "fused_package", project)
    done = subprocess.run(
        [sys.executable, "-m", "npu_migrate", "apply", str(project)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    module = (project / "fusedpkg" / "_npu_fused.py").read_text(encoding="utf-8")
    assert "def _npu_sdpa(" in module
    assert max(len(line) for line in module.splitlines()) <= NARROWEST
