"""``k0s-fleet``: a thin dispatcher; each subcommand lives with the code it runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fleet import demo as demo_cli
from fleet import upgrade_cli
from fleet.agents import cli as agent_cli
from fleet.controllers import cli as controller_cli
from fleet.rollout import cli as plan_cli
from fleet.status import cli as status_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k0s-fleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    agent = sub.add_parser("agent", help=agent_cli.HELP, description=agent_cli.HELP)
    agent_cli.add_arguments(agent)
    agent.set_defaults(func=agent_cli.run)
    for name, mod in (("upgrade", upgrade_cli), ("plan", plan_cli), ("status", status_cli),
                      ("controller", controller_cli), ("demo", demo_cli)):
        cmd = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(cmd)
        cmd.set_defaults(func=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
