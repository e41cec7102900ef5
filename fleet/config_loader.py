"""Loading the fleet configuration: one YAML file plus environment overrides.

:func:`load_config` is the single entry point. It reads the YAML file named by its
``path`` argument or by ``K0S_FLEET_CONFIG``, applies ``K0S_FLEET_<KEY>__<SUBKEY>``
environment overrides on top (the environment wins), and validates everything at once.
Anything wrong (a missing file, bad YAML, an unknown key, a wrong type, an impossible
value) raises :class:`fleet.config_errors.ConfigError`, whose message has one line per
problem, each naming the dotted key path, e.g.
``rollout.waves[1].maxConcurrentClusters: must be >= 1``.

Why not pydantic-settings' own sources: its environment source silently ignores unknown
variables (a typo would be a no-op), does not match camelCase aliases in nested keys, and
reads only ``os.environ``; as a root class, ``BaseSettings`` also lets snake_case keys
into files. The override layer here is small and strict instead.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from fleet.config import FleetConfig, NodePolicySettings
from fleet.config_errors import ConfigError, ConfigProblem, problems_from

ENV_PREFIX = "K0S_FLEET_"
CONFIG_PATH_ENV = "K0S_FLEET_CONFIG"


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
    overrides, origins, env_problems = _env_overrides(environ)
    problems += env_problems
    if problems:
        raise ConfigError(problems, source)
    merged = _deep_merge(data, overrides)
    try:
        return FleetConfig.model_validate(merged, by_alias=True, by_name=False)
    except ValidationError as e:
        raise ConfigError(problems_from(e, origins), source) from None


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


def _read_yaml(source: str) -> tuple[dict[str, Any], list[ConfigProblem]]:
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, [ConfigProblem(source, "config file not found")]
    except (OSError, UnicodeDecodeError) as e:
        return {}, [ConfigProblem(source, f"cannot read config file: {e}")]
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        return {}, [ConfigProblem(source, f"{where}invalid YAML: {what}")]
    except yaml.YAMLError as e:
        return {}, [ConfigProblem(source, f"invalid YAML: {e}")]
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


def _strip_annotation(tp: Any) -> tuple[Any, bool]:
    """The annotation without ``Annotated`` / ``| None``, and whether None was allowed."""
    optional = False
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin is Union or origin is types.UnionType:
            args = [a for a in get_args(tp) if a is not type(None)]
            optional = optional or len(args) < len(get_args(tp))
            if len(args) != 1:
                return tp, optional
            tp = args[0]
        else:
            return tp, optional


def _norm(s: str) -> str:
    return s.replace("_", "").lower()


# K0S_FLEET_AGENT_<SETTING> configures the agent process (fleet.agents.settings); the
# controller's fleet config takes its ``agent:`` section as K0S_FLEET_AGENT__<KEY>. The
# single-underscore spelling of one of those keys on the controller is a mix-up, not
# something for another part of k0s-fleet: say so rather than ignore it.
_AGENT_PROCESS_PREFIX = "K0S_FLEET_AGENT_"


def _agent_setting_for_the_config(var: str) -> str | None:
    upper = var.upper()
    if not upper.startswith(_AGENT_PROCESS_PREFIX) or upper.startswith("K0S_FLEET_AGENT__"):
        return None
    rest = _norm(upper[len(_AGENT_PROCESS_PREFIX):])
    for name, field in NodePolicySettings.model_fields.items():
        if rest in (_norm(name), _norm(field.alias or name)):
            return (f"{var} is the agent's own setting (k0s-fleet agent); the fleet config's "
                    f"agent.{field.alias or name} is set with "
                    f"K0S_FLEET_AGENT__{upper[len(_AGENT_PROCESS_PREFIX):]}")
    return None


def _env_overrides(
    env: Mapping[str, str],
) -> tuple[dict[str, Any], dict[tuple[str, ...], str], list[ConfigProblem]]:
    """``K0S_FLEET_A__B__C=value`` -> ``{"a": {"b": {"c": value}}}`` (by YAML key).

    Segments match keys case-insensitively, with or without underscores (both
    ``MAX_CONCURRENT_CLUSTERS`` and ``MAXCONCURRENTCLUSTERS`` name
    ``maxConcurrentClusters``). Values of lists, mappings and sections are YAML/JSON.
    Prefixed variables without ``__`` that name no top-level key are left alone: they
    belong to other parts of k0s-fleet.
    """
    data: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    problems: list[ConfigProblem] = []
    for var in sorted(env):
        if not var.upper().startswith(ENV_PREFIX) or var.upper() == CONFIG_PATH_ENV:
            continue
        misplaced = _agent_setting_for_the_config(var)
        if misplaced is not None:
            problems.append(ConfigProblem(var, misplaced))
            continue
        segments = var[len(ENV_PREFIX) :].split("__")
        model: type[BaseModel] | None = FleetConfig
        path: list[str] = []
        leaf: Any = None
        optional = False
        for seg in segments:
            if model is None:
                problems.append(ConfigProblem(var, f"{'.'.join(path)} has no sub-keys (in {var})"))
                break
            found = None
            for name, field in model.model_fields.items():
                alias = field.alias or name
                if _norm(seg) in (_norm(alias), _norm(name)):
                    found = (alias, field)
                    break
            if found is None:
                if len(segments) > 1 or path:
                    where = ".".join([*path, seg.lower()])
                    problems.append(ConfigProblem(var, f"unknown key {where}"))
                break
            alias, field = found
            path.append(alias)
            leaf, optional = _strip_annotation(field.annotation)
            model = leaf if isinstance(leaf, type) and issubclass(leaf, BaseModel) else None
        else:
            value = env[var]
            complex_leaf = model is not None or get_origin(leaf) in (list, dict)
            parsed: Any = value
            if optional and value.strip() == "":
                parsed = None
            elif complex_leaf:
                try:
                    parsed = yaml.load(value, Loader=StrictLoader)
                except yaml.YAMLError as e:
                    problems.append(
                        ConfigProblem(".".join(path), f"invalid YAML/JSON in {var}: {e}")
                    )
                    continue
            node = data
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = parsed
            origins[tuple(path)] = var
    return data, origins, problems
