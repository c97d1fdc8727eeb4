"""Generated code is laid out as the file's own: within its width, split black's way, double quotes."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys

from conftest import FIXTURES

from npu_migrate.layout import NARROWEST, fit, line_width
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


def test_unparsed_strings_get_double_quotes_unless_that_needs_escaping():
    assert fit("f(x, mode='half', s='say \"hi\"')\n", 120) == 'f(x, mode="half", s=\'say "hi"\')\n'


def test_the_indentation_unit_is_the_files():
    laid = fit("if a:\n  return f(" + ", ".join(f"argument_{i}" for i in range(12)) + ")\n", 60, indent="  ")
    assert laid.splitlines()[1] == "  return f("
    assert laid.splitlines()[2].startswith("    argument_0,")


# -- the injected helpers ---------------------------------------------------------------------------------


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
