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
