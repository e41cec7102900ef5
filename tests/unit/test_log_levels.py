"""The controller's ``--log-level``: one level for every logger, then LOGGER=LEVEL pairs
(fleet.cli.controller.log_levels); anything else is refused, naming the part."""

from __future__ import annotations

import pytest

from fleet.cli.controller import log_levels


def test_one_level_sets_every_logger() -> None:
    assert log_levels("info") == ("INFO", {})


def test_pairs_set_single_loggers() -> None:
    assert log_levels("WARNING, fleet.controllers.runner=debug,fleet.kube=ERROR") == (
        "WARNING", {"fleet.controllers.runner": "DEBUG", "fleet.kube": "ERROR"})


@pytest.mark.parametrize("text, named", [
    ("LOUD", "'LOUD' is not a level"),
    ("INFO,fleet.controllers.runner", "'fleet.controllers.runner' is not LOGGER=LEVEL"),
    ("INFO,=DEBUG", "'=DEBUG' is not LOGGER=LEVEL"),
    ("INFO,fleet=CHATTY", "'fleet=CHATTY' is not LOGGER=LEVEL"),
    ("INFO,", "'' is not LOGGER=LEVEL"),
])
def test_what_is_not_understood_is_named(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        log_levels(text)
