"""``k0s-fleet``: one module per command (``fleet/cli/<command>.py``).

A command's module is imported only when that command runs (or its ``--help`` is
asked for), so ``k0s-fleet --help`` imports none of them and each module imports what
its command needs at the top, like any other module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from fleet import __version__


class CommandModule(Protocol):
    """What each ``fleet/cli/<command>.py`` provides."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


@dataclass(frozen=True, slots=True)
class Command:
    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "agent": Command("fleet.cli.agent",
                     "run the node agent (performs this node's in-place k0s upgrades)"),
    "upgrade": Command("fleet.cli.upgrade", "ask the fleet (or matching clusters) for a k0s "
                       "version and follow the upgrade"),
    "plan": Command("fleet.cli.plan",
                    "dry run: print what the rollout would do from here (writes nothing)"),
    "status": Command("fleet.cli.status",
                      "show the fleet rollout: waves, clusters, nodes by state, halted objects"),
    "controller": Command("fleet.cli.controller", "run the controller: watch Cluster API "
                          "objects and upgrade k0s in place"),
    "demo": Command("fleet.cli.demo", "watch a simulated fleet (real API servers, real "
                    "agents) upgrade k0s in place"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, just that command's arguments are loaded
    (the others are listed with their help)."""
    parser = argparse.ArgumentParser(
        prog="k0s-fleet", description="In-place k0s upgrades across a fleet of Cluster API "
        "/ k0smotron clusters.")
    parser.add_argument("--version", action="version", version=f"k0s-fleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        if only is None or only == name:
            try:
                module = cast(CommandModule, importlib.import_module(cmd.module))
            except ModuleNotFoundError as e:
                if not (e.name or "").startswith("fleet.testing"):
                    raise
                # the wheel leaves the test world out (pyproject.toml): the demo runs
                # from a checkout of the repository
                parser.exit(2, f"k0s-fleet {name}: runs from a checkout of the repository "
                               "(`make demo`), not from an installed k0s-fleet\n")
            module.add_arguments(p)
            p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in args_in if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else "")
    args = parser.parse_args(args_in)
    return int(args.func(args))
