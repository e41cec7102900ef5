"""Loading the fleet configuration: one YAML file, environment overrides, and the command
line's, as pydantic-settings sources.

:func:`load_config` is the single entry point. Its sources, highest priority first, are
the caller's ``overrides`` (pydantic-settings' :class:`InitSettingsSource`, e.g. the
CLI's ``--kubeconfig``), the ``K0S_FLEET_<KEY>__<SUBKEY>`` environment
(:class:`FleetEnvironment`) and the YAML file named by its ``path`` argument or by
``K0S_FLEET_CONFIG`` (:class:`FleetFile`); pydantic-settings merges them, section by
section, into :class:`_FleetSettings` and validates everything at once. Anything wrong (a
missing file, bad YAML, an unknown key, a wrong type, an impossible value) raises
:class:`fleet.config.errors.ConfigError`, whose message has one line per problem, each
naming the dotted key path, e.g. ``rollout.waves[1].maxConcurrentClusters: must be >= 1``.

The environment source is pydantic-settings' own :class:`EnvSettingsSource` (prefix
``K0S_FLEET_``, ``__`` between nesting levels, case-insensitive, nested sections
exploded: :class:`_FleetSettings`' ``model_config``), with what the fleet needs laid
around it: it reads the mapping it is given, not only ``os.environ``; a segment names a
key with or without underscores (``MAX_CONCURRENT_CLUSTERS`` and
``MAXCONCURRENTCLUSTERS`` both name ``maxConcurrentClusters``), so what it hands on uses
the file's camelCase keys and the file alone stays camelCase-only; values of lists,
mappings and sections are YAML (a superset of JSON); an empty value clears an optional
key; and it is strict, where the library ignores what it does not recognise: a
``K0S_FLEET_A__B`` whose ``A`` is no key is an error naming the variable, an unknown
``B`` is an unknown key, two spellings of one key are refused. Prefixed variables without
``__`` that name no top-level key are left alone: they belong to other parts of k0s-fleet
(``K0S_FLEET_AGENT_<SETTING>`` is the agent process's, :mod:`fleet.agents.settings`),
except the agent's spelling of a key of the fleet config's ``agent:`` section, which is a
mix-up and named as one (naming both variables; the agent refuses the other spelling).
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from fleet.config.errors import ConfigError, ConfigProblem, problems_from
from fleet.config.models import FleetConfig
from fleet.contract.problems import UnparsableValue
from fleet.contract.signal import misplaced_policy_variable

ENV_PREFIX = "K0S_FLEET_"
CONFIG_PATH_ENV = "K0S_FLEET_CONFIG"
_NESTING = "__"


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> FleetConfig:
    """Load the fleet configuration.

    ``path`` (else ``env["K0S_FLEET_CONFIG"]``) names a YAML file; without either, the
    defaults apply. ``env`` (default: ``os.environ``) supplies overrides such as
    ``K0S_FLEET_ROLLOUT__MAX_CONCURRENT_CLUSTERS=3``; they win over the file.
    ``overrides`` (camelCase keys, nested sections merged) win over both. Raises
    :class:`ConfigError` listing every problem found.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    source = os.fspath(path) if path is not None else (environ.get(CONFIG_PATH_ENV) or None)
    file = FleetFile(_FleetSettings, source)
    environment = FleetEnvironment(_FleetSettings, environ)
    problems = [*file.problems, *environment.problems]
    if file.problems:  # nothing to validate
        raise ConfigError(problems, source)
    given = InitSettingsSource(_FleetSettings, dict(overrides or {}))
    try:
        settings = _FleetSettings(_build_sources=((given, environment, file), {}))
    except ValidationError as e:
        problems += problems_from(e, environment.variable_for)
    if problems:
        raise ConfigError(problems, source)
    return settings.config()


class _ByAlias:
    """Validates what the sources merged by the file's keys only (camelCase, as a
    :class:`FleetConfig` is loaded): stands after :class:`BaseSettings`, whose
    ``__init__`` hands it the merged values."""

    __pydantic_validator__: Any

    def __init__(self, **data: Any) -> None:
        self.__pydantic_validator__.validate_python(
            data, self_instance=self, by_alias=True, by_name=False)


class _FleetSettings(BaseSettings, _ByAlias, FleetConfig):
    """:class:`FleetConfig` as pydantic-settings builds it from :func:`load_config`'s
    sources (only: ``_FleetSettings()`` alone would read the environment laxly, so it stays
    private)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=_NESTING, case_sensitive=False,
        validate_default=False)

    def config(self) -> FleetConfig:
        """The same values as a plain :class:`FleetConfig` (already validated)."""
        fields = {name: getattr(self, name) for name in FleetConfig.model_fields}
        return FleetConfig.model_construct(self.model_fields_set, **fields)


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


class FleetFile(PydanticBaseSettingsSource):
    """The YAML file as a settings source: its mapping as written (camelCase keys, read
    with :class:`StrictLoader`); :attr:`problems` says why a file given could not be read
    (missing, unreadable, not YAML, not a mapping), where pydantic-settings' own YAML
    source would skip a missing file."""

    def __init__(self, settings_cls: type[BaseSettings], source: str | None) -> None:
        super().__init__(settings_cls)
        self.problems: list[ConfigProblem] = []
        self._data: dict[str, Any] = {}
        if source is not None:
            self._data = self._read(source)

    def _read(self, source: str) -> dict[str, Any]:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except FileNotFoundError:
            self.problems.append(ConfigProblem(source, "config file not found"))
            return {}
        except (OSError, UnicodeDecodeError) as e:
            self.problems.append(ConfigProblem(source, f"cannot read config file: {e}"))
            return {}
        try:
            data = yaml.load(text, Loader=StrictLoader)
        except yaml.YAMLError as e:
            self.problems.append(ConfigProblem(source, _yaml_problem(e)))
            return {}
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.problems.append(ConfigProblem(
                source, f"must be a YAML mapping at the top (got {type(data).__name__})"))
            return {}
        return data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field.alias or field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._data


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


class FleetEnvironment(EnvSettingsSource):
    """The ``K0S_FLEET_*`` variables of ``environ`` as a partial fleet config (camelCase
    keys), through pydantic-settings' environment source; :attr:`problems` lists the
    variables that are wrong before any value is looked at."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self.problems: list[ConfigProblem] = []
        # variable name as the source sees it -> (the variable, its segments by letters)
        self._variables: dict[str, tuple[str, tuple[str, ...]]] = {}
        top = {_letters(f.alias or n) for n, f in FleetConfig.model_fields.items()}
        for var in sorted(environ):
            if not var.upper().startswith(ENV_PREFIX) or var.upper() == CONFIG_PATH_ENV:
                continue
            segments = tuple(_letters(s) for s in var[len(ENV_PREFIX):].split(_NESTING))
            if segments[0] not in top:
                mixup = misplaced_policy_variable(var, on_agent=False)
                if mixup is not None:
                    self.problems.append(ConfigProblem(var, f"{var} {mixup}"))
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
        super().__init__(settings_cls)  # prefix, delimiter, case: settings_cls.model_config

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
