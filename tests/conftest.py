import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def pytest_addoption(parser):
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        help="Rewrite the expected .out.py / .findings.txt files from the current output (review the diff!).",
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
