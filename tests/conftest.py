import ast
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def pytest_addoption(parser):
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        help="Rewrite the expected .out.py / .findings.txt files from the current output (review the diff!).",
    )


#: The packages of the `integration` extra. A test that needs one is marked `integration`; a run with only
#: the light `test` extra deselects those with `-m "not integration"`.
INTEGRATION_PACKAGES = ("torch", "transformers")
_DESELECTED = re.compile(r"\bnot\s+integration\b")


def pytest_ignore_collect(collection_path, config):
    """A module marked `integration` as a whole may import torch at the top, so without the extra it
    cannot even be collected. When the run deselects those tests anyway, it is not collected; when the run
    wants them, the import error stands (a missing extra is a failure, never a silent skip)."""
    if collection_path.suffix != ".py" or not _DESELECTED.search(config.option.markexpr or ""):
        return None
    if all(importlib.util.find_spec(name) is not None for name in INTEGRATION_PACKAGES):
        return None
    return True if marked_integration(ast.parse(collection_path.read_text(encoding="utf-8"))) else None


def marked_integration(module: ast.Module) -> bool:
    """Whether a test module marks all its tests `integration` (`pytestmark = ...`)."""
    return any(
        isinstance(node, ast.Assign)
        and any(getattr(target, "id", "") == "pytestmark" for target in node.targets)
        and "integration" in ast.unparse(node.value)
        for node in module.body
    )


@pytest.fixture
def update_fixtures(request) -> bool:
    return request.config.getoption("--update-fixtures")


from hypothesis import HealthCheck, settings  # noqa: E402

# CI runs a modest number of examples; `pytest --hypothesis-profile=fuzz tests/test_properties.py` is the
# long run (see README).
settings.register_profile("default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile("default")
