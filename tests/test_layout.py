"""Generated code is laid out as the file's own: within its width, split black's way, double quotes."""

from __future__ import annotations

import ast

from npu_migrate.layout import fit, line_width

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


def test_unparsed_strings_get_double_quotes_unless_that_needs_escaping():
    assert fit("f(x, mode='half', s='say \"hi\"')\n", 120) == 'f(x, mode="half", s=\'say "hi"\')\n'


def test_the_indentation_unit_is_the_files():
    laid = fit("if a:\n  return f(" + ", ".join(f"argument_{i}" for i in range(12)) + ")\n", 60, indent="  ")
    assert laid.splitlines()[1] == "  return f("
    assert laid.splitlines()[2].startswith("    argument_0,")
