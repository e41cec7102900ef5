"""What is wrong with a fleet configuration: one problem per line, each naming its key.

:class:`ConfigError` is what a user sees (one line per :class:`ConfigProblem`); model
validators raise :class:`Problems` to report several problems at paths relative to the
model; :func:`problems_from` rewrites pydantic's errors into that one-line form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from pydantic import ValidationError

from fleet.contract.problems import Problems, format_path, pydantic_message


class ConfigProblem(NamedTuple):
    """One thing wrong with the configuration: where (dotted key path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ConfigError(ValueError):
    """The fleet configuration is unusable. ``str()`` is one line per problem."""

    def __init__(self, problems: Sequence[ConfigProblem], source: str | None = None) -> None:
        self.problems = tuple(problems)
        self.source = source
        super().__init__("\n".join(str(p) for p in self.problems))



def problems_from(
    e: ValidationError, origin: Callable[[tuple[str | int, ...]], str | None]
) -> list[ConfigProblem]:
    """One problem per error (a validator's :class:`Problems` each), naming the key and,
    where ``origin`` knows one, the environment variable that set it."""
    problems: list[ConfigProblem] = []
    for err in e.errors(include_url=False):
        loc = tuple(err["loc"])
        inner = (err.get("ctx") or {}).get("error")
        pairs = (
            [(loc + rel, msg) for rel, msg in inner.problems]
            if isinstance(inner, Problems)
            else [(loc, pydantic_message(err))]
        )
        for full, msg in pairs:
            var = origin(full)
            suffix = f" (from {var})" if var else ""
            problem = ConfigProblem(format_path(full), msg + suffix)
            if problem not in problems:
                problems.append(problem)
    return problems
