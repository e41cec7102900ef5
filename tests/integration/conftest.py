import pytest

# the agent tests' release server and simulated nodes (a module may define its own)
from tests.helpers.agent import releases, sim  # noqa: F401

# a short directory for the simulated nodes of the Cluster API tests
from tests.helpers.capienv import short_tmp  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
