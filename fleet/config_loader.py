"""Loading the fleet configuration: one YAML file plus environment overrides.

:func:`load_config` is the single entry point. It reads the YAML file named by its
``path`` argument or by ``K0S_FLEET_CONFIG``, applies ``K0S_FLEET_<KEY>__<SUBKEY>``
environment overrides on top (the environment wins), and validates everything at once.
Anything wrong (a missing file, bad YAML, an unknown key, a wrong type, an impossible
value) raises :class:`fleet.config_errors.ConfigError`, whose message has one line per
problem, each naming the dotted key path, e.g.
``rollout.waves[1].maxConcurrentClusters: must be >= 1``.

The environment layer is pydantic-settings' own :class:`EnvSettingsSource` (prefix
``K0S_FLEET_``, ``__`` between nesting levels, case-insensitive, nested sections
exploded), with what the fleet needs laid around it (:class:`FleetEnvironment`): it reads
the mapping it is given, not only ``os.environ``; a segment names a key with or without
underscores (``MAX_CONCURRENT_CLUSTERS`` and ``MAXCONCURRENTCLUSTERS`` both name
``maxConcurrentClusters``), so what it hands on uses the file's camelCase keys and the
file alone stays camelCase-only; values of lists, mappings and sections are YAML (a
superset of JSON); an empty value clears an optional key; and it is strict, where the
library ignores what it does not recognise: a ``K0S_FLEET_A__B`` whose ``A`` is no key
is an error naming the variable, an unknown ``B`` is an unknown key, two spellings of
one key are refused. Prefixed variables without ``__`` that name no top-level key are
left alone: they belong to other parts of k0s-fleet (``K0S_FLEET_AGENT_<SETTING>`` is
the agent's), except the agent's spelling of a key of the fleet config's ``agent:``
section, which is a mix-up and named as one.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, cast, get_args, get_origin

import yaml
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource

from fleet.config import FleetConfig, NodePolicySettings
from fleet.config_errors import ConfigError, ConfigProblem, UnparsableValue, problems_from

ENV_PREFIX = "K0S_FLEET_"
CONFIG_PATH_ENV = "K0S_FLEET_CONFIG"
_NESTING = "__"


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> FleetConfig:
    """Load the fleet configuration.

    ``path`` (else ``env["K0S_FLEET_CONFIG"]``) names a YAML file; without either, the
    defaults apply. ``env`` (default: ``os.environ``) supplies overrides such as
    ``K0S_FLEET_ROLLOUT__MAX_CONCURRENT_CLUSTERS=3``; they win over the file. Raises
    :class:`ConfigError` listing every problem found.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    source = os.fspath(path) if path is not None else (environ.get(CONFIG_PATH_ENV) or None)
    problems: list[ConfigProblem] = []
    data: dict[str, Any] = {}
    if source is not None:
        data, file_problems = _read_yaml(source)
        problems += file_problems
    environment = FleetEnvironment(environ)
    problems += environment.problems
    if len(problems) > len(environment.problems):  # the file: nothing to validate
        raise ConfigError(problems, source)
    try:
        config = FleetConfig.model_validate(
            _deep_merge(data, environment()), by_alias=True, by_name=False
        )
    except ValidationError as e:
        problems += problems_from(e, environment.variable_for)
    if problems:
        raise ConfigError(problems, source)
    return config


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """One line: where (when known) and what."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        return f"{where}invalid YAML: {what}"
    return "invalid YAML: " + " ".join(str(e).split())


def _read_yaml(source: str) -> tuple[dict[str, Any], list[ConfigProblem]]:
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, [ConfigProblem(source, "config file not found")]
    except (OSError, UnicodeDecodeError) as e:
        return {}, [ConfigProblem(source, f"cannot read config file: {e}")]
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as e:
        return {}, [ConfigProblem(source, _yaml_problem(e))]
    if data is None:
        return {}, []
    if not isinstance(data, dict):
        return {}, [
            ConfigProblem(source, f"must be a YAML mapping at the top (got {type(data).__name__})")
        ]
    return data, []


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _letters(segment: str) -> str:
    """What a key or variable segment is matched by: ``MAX_CONCURRENT_CLUSTERS`` and
    ``maxConcurrentClusters`` are both ``maxconcurrentclusters``."""
    return segment.replace("_", "").lower()


def _admits_none(field: object) -> bool:
    if not isinstance(field, FieldInfo):
        return False
    tp = field.annotation
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


# K0S_FLEET_AGENT_<SETTING> configures the agent process (fleet.agents.settings); the
# controller's fleet config takes its ``agent:`` section as K0S_FLEET_AGENT__<KEY>.
_AGENT_PROCESS_PREFIX = "K0S_FLEET_AGENT_"


def _agent_setting_for_the_config(var: str) -> str | None:
    """The one-underscore (agent process) spelling of an ``agent:`` key, explained."""
    upper = var.upper()
    if not upper.startswith(_AGENT_PROCESS_PREFIX) or upper.startswith("K0S_FLEET_AGENT__"):
        return None
    rest = upper[len(_AGENT_PROCESS_PREFIX):]
    for name, field in NodePolicySettings.model_fields.items():
        key = field.alias or name
        if _letters(rest) == _letters(key):
            return (f"{var} is the agent's own setting (k0s-fleet agent); the fleet config's "
                    f"agent.{key} is set with K0S_FLEET_AGENT__{rest}")
    return None


class FleetEnvironment(EnvSettingsSource):
    """The ``K0S_FLEET_*`` variables of ``environ`` as a partial fleet config (camelCase
    keys), through pydantic-settings' environment source; :attr:`problems` lists the
    variables that are wrong before any value is looked at."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.problems: list[ConfigProblem] = []
        # variable name as the source sees it -> (the variable, its segments by letters)
        self._variables: dict[str, tuple[str, tuple[str, ...]]] = {}
        top = {_letters(f.alias or n) for n, f in FleetConfig.model_fields.items()}
        for var in sorted(environ):
            if not var.upper().startswith(ENV_PREFIX) or var.upper() == CONFIG_PATH_ENV:
                continue
            segments = tuple(_letters(s) for s in var[len(ENV_PREFIX):].split(_NESTING))
            if segments[0] not in top:
                mixup = _agent_setting_for_the_config(var)
                if mixup is not None:
                    self.problems.append(ConfigProblem(var, mixup))
                elif len(segments) > 1:
                    self.problems.append(ConfigProblem(segments[0], f"unknown key (from {var})"))
                continue
            name = (ENV_PREFIX + _NESTING.join(segments)).lower()
            if name in self._variables:
                other = self._variables[name][0]
                self.problems.append(ConfigProblem(var, f"sets the same key as {other}"))
                continue
            self._variables[name] = (var, segments)
        self._environ = environ
        super().__init__(
            # The source reads only the model's fields and configuration; the result is
            # validated as a FleetConfig by load_config, with the file's data.
            cast("type[BaseSettings]", FleetConfig),
            case_sensitive=False,
            env_prefix=ENV_PREFIX,
            env_nested_delimiter=_NESTING,
        )

    def _load_env_vars(self) -> Mapping[str, str | None]:
        """The variables to read: ours, each segment reduced to its letters."""
        return {name: self._environ[var] for name, (var, _) in self._variables.items()}

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        """A list, mapping or section is YAML; what does not parse fails validation at
        its key, saying why."""
        try:
            return yaml.load(value, Loader=StrictLoader)
        except yaml.YAMLError as e:
            return UnparsableValue(_yaml_problem(e).replace("invalid YAML", "invalid YAML/JSON"))

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        return self._empty_is_null(
            field, super().prepare_field_value(field_name, field, value, value_is_complex)
        )

    def _empty_is_null(self, field: object, value: Any) -> Any:
        """An empty value clears an optional key (elsewhere it is validated as given)."""
        if value == "" and _admits_none(field):
            return None
        if isinstance(value, dict) and isinstance(field, FieldInfo):
            return {k: self._empty_is_null(self.next_field(field, k, False), v)
                    for k, v in value.items()}
        return value

    def variable_for(self, loc: tuple[str | int, ...]) -> str | None:
        """The variable that set the key at ``loc`` (or the section holding it), else the
        variables that set something below it."""
        key = tuple(_letters(str(p)) for p in loc)
        above = [(len(s), var) for var, s in self._variables.values() if key[:len(s)] == s]
        if above:
            return max(above)[1]
        below = [var for var, s in self._variables.values() if s[:len(key)] == key]
        return ", ".join(below) or None
