"""What is wrong with a Kubernetes-shaped value, one line per problem: pydantic's errors
rewritten to name the key (``spec.drainRules[0].selector: unknown key``), for the fleet
configuration and for the objects and annotations read off the wire alike."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any


class UnparsableValue:
    """A value that could not be read (e.g. bad YAML in an environment variable), standing
    in for it so that validation fails at its key; ``str()`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __str__(self) -> str:
        return self.reason

    def __repr__(self) -> str:
        return f"UnparsableValue({self.reason!r})"


class Problems(ValueError):
    """Raised by model validators to report problems at paths relative to the model."""

    def __init__(self, problems: Sequence[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(m for _, m in self.problems))


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def format_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "(top level)"


def _short(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def pydantic_message(err: Mapping[str, Any]) -> str:
    if isinstance(err.get("input"), UnparsableValue):
        return str(err["input"])
    t = err["type"]
    ctx = err.get("ctx") or {}
    got = f" (got {_short(err.get('input'))})"
    simple = {
        "extra_forbidden": "unknown key",
        "missing": "required",
        "list_type": "must be a list" + got,
        "dict_type": "must be a mapping" + got,
        "model_type": "must be a mapping" + got,
        "model_attributes_type": "must be a mapping" + got,
        "string_type": "must be a string" + got,
        "bool_type": "must be true or false" + got,
        "bool_parsing": "must be true or false" + got,
        "int_type": "must be an integer" + got,
        "int_parsing": "must be an integer" + got,
        "int_from_float": "must be an integer" + got,
        "float_type": "must be a number" + got,
        "float_parsing": "must be a number" + got,
        "string_pattern_mismatch": f"must match {ctx.get('pattern')}" + got,
    }
    if t in simple:
        return simple[t]
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if t in bounds:
        op, key = bounds[t]
        return f"must be {op} {ctx.get(key)}"
    if t == "string_too_short":
        return "must not be empty"
    if t == "enum":
        return f"must be one of {ctx.get('expected')}" + got
    if t in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    return str(err.get("msg", t))
