"""``k0s-fleet agent``: flags override ``K0S_FLEET_AGENT_*`` environment settings.

The flags are generated from :class:`~fleet.agents.settings.AgentSettings`, so every
setting has one and none can drift: ``--<field-name>`` in kebab case, the field's
description as help; ``--no-<name>`` for a switch that defaults on; a repeatable
``--<name in the singular>`` for a tuple (``file_url_roots`` -> ``--file-url-root``,
``allowed_url_prefixes`` -> ``--allowed-url-prefix``); choices for an enum; ``''`` clears an
optional path. Every flag defaults to "not given", so the environment (or the default)
applies.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import types
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import anyio
from pydantic import BaseModel, ValidationError

from fleet.agents.agent import serve
from fleet.agents.settings import AgentSettings, environment_problems
from fleet.cli.exit import Exit
from fleet.contract.tracecontext import TracingOptions, get_tracer, tracing_wanted

_SCALARS: dict[Any, Any] = {str: str, int: int, float: float, Path: Path}


def _optional_path(value: str) -> Path | None:
    return Path(value) if value else None


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The type without ``| None``, and whether None is allowed."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(get_args(annotation))
    return annotation, False


def _singular(flag: str) -> str:
    for plural, singular in (("xes", "x"), ("ses", "s"), ("s", "")):
        if flag.endswith(plural):
            return flag.removesuffix(plural) + singular
    return flag


def add_settings_flags(p: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per field of ``model`` (see the module docstring for the rules)."""
    S = argparse.SUPPRESS
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        tp, optional = _unwrap(field.annotation)
        kw: dict[str, Any] = {"dest": name, "default": S, "help": field.description}
        if tp is bool:
            if field.default is True:
                p.add_argument("--no-" + flag[2:], action="store_false", **kw)
            else:
                p.add_argument(flag, action="store_true", **kw)
        elif get_origin(tp) is tuple and get_args(tp)[0] in _SCALARS:
            p.add_argument(_singular(flag), type=_SCALARS[get_args(tp)[0]],
                           action="append", **kw)
        elif isinstance(tp, type) and issubclass(tp, Enum):
            p.add_argument(flag, choices=[str(m.value) for m in tp], **kw)
        elif tp is Path and optional:
            p.add_argument(flag, type=_optional_path, **kw)
        elif tp in _SCALARS:
            p.add_argument(flag, type=_SCALARS[tp], **kw)
        else:
            raise TypeError(f"{model.__name__}.{name}: no flag for type {field.annotation!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_settings_flags(p, AgentSettings)


def settings_from(args: argparse.Namespace) -> AgentSettings:
    """The flags given, over the environment, over the defaults."""
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "func")}
    return AgentSettings(**overrides)


def run(args: argparse.Namespace) -> int:
    misnamed = environment_problems(os.environ)
    for line in misnamed:
        print(f"k0s-fleet agent: {line}", file=sys.stderr)
    if misnamed:
        return Exit.BAD_CONFIG
    try:
        settings = settings_from(args)
    except ValidationError as e:
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "settings"
            print(f"k0s-fleet agent: {loc}: {err['msg']}", file=sys.stderr)
        return Exit.BAD_CONFIG
    logging.basicConfig(
        level=settings.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    provider = None
    tracer = None
    tracing = TracingOptions(
        otlp_endpoint=settings.otlp_endpoint, service_name=settings.otel_service_name,
        sampling_ratio=settings.trace_sampling_ratio,
        trace_file=str(settings.trace_file) if settings.trace_file else None)
    if tracing_wanted(tracing):
        # Only an agent that exports pays for the OpenTelemetry SDK (~5 MiB, ~0.05 s of
        # start-up CPU on every node; bench/agent_footprint.py).
        from fleet.telemetry import setup_tracing  # noqa: PLC0415

        provider = setup_tracing(tracing, default_service_name="k0s-fleet-agent",
                                 resource_attributes={"k8s.node.name": settings.node_name})
        tracer = get_tracer("fleet.agents", provider)
    try:
        anyio.run(serve, settings, tracer)
    except KeyboardInterrupt:
        pass
    except OSError as e:  # unreadable kubeconfig, unwritable state directory, ...
        print(f"k0s-fleet agent: {e}", file=sys.stderr)
        return Exit.FAILED
    finally:
        if provider is not None:
            provider.shutdown()
    return Exit.OK
