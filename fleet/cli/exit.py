"""The CLI's exit codes, apart from :mod:`fleet.cli.common` so that ``k0s-fleet agent``
imports nothing of the controller's (configuration, world view) to say how it ended."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # the command ran and failed (unreachable cluster, upgrade Failed, ...)
    BAD_CONFIG = 2  # bad input: arguments, the fleet config, a kubeconfig, no controller
    NOT_DONE = 3  # upgrade: not complete within --timeout
    LOST_LEADERSHIP = 4  # the controller lost its Lease (its Pod restarts)
    INTERRUPTED = 130
