"""Which of Cluster API's MachineDrainRules apply to a Machine, as the request carries them
(pure: the rule objects, the Machine's and its Cluster's labels).

Cluster API's rules, as its drain applies them: the rules of the Machine's namespace; a
rule with no ``spec.machines`` applies to every Machine, otherwise to a Machine one of
whose selectors matches it (``selector`` against the Machine's labels AND
``clusterSelector`` against its Cluster's; either left out selects everything); the
applying rules are tried in name order and the first whose ``spec.pods`` select a pod
decides for it (the agent does that part: :mod:`fleet.agents.drain`). A rule the agent
could not apply faithfully (a selector that is not one, an unknown behavior, an order on
a rule that does not drain) is an error naming the rule and the field: nothing is sent
rather than a drain that ignores what the user wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from fleet.contract.selectors import LabelSelector, selector_matches
from fleet.contract.signal import MAX_DRAIN_RULES, DrainRule


class DrainRuleError(ValueError):
    """A MachineDrainRule that cannot be carried out as written."""


def _valid_selector(rule: str, where: str, sel: Any) -> Mapping[str, Any]:
    if sel is None:
        return {}
    try:
        LabelSelector.model_validate(sel, by_alias=True)
    except ValidationError as e:
        first = e.errors()[0]
        raise DrainRuleError(f"MachineDrainRule {rule}: {where} is not a label selector "
                             f"({first.get('msg')})") from None
    if not isinstance(sel, Mapping):  # pragma: no cover - model_validate refused it
        raise DrainRuleError(f"MachineDrainRule {rule}: {where} is not a label selector")
    return sel


def applies_to_machine(rule: Mapping[str, Any], machine_labels: Mapping[str, str],
                       cluster_labels: Mapping[str, str]) -> bool:
    name = str((rule.get("metadata") or {}).get("name"))
    machines = (rule.get("spec") or {}).get("machines") or []
    if not isinstance(machines, list):
        raise DrainRuleError(f"MachineDrainRule {name}: spec.machines is not a list")
    if not machines:
        return True
    for i, m in enumerate(machines):
        if not isinstance(m, Mapping):
            raise DrainRuleError(f"MachineDrainRule {name}: spec.machines[{i}] is not an "
                                 "object")
        sel = _valid_selector(name, f"spec.machines[{i}].selector", m.get("selector"))
        csel = _valid_selector(name, f"spec.machines[{i}].clusterSelector",
                               m.get("clusterSelector"))
        if selector_matches(sel, machine_labels) and selector_matches(csel, cluster_labels):
            return True
    return False


def as_request_rule(rule: Mapping[str, Any]) -> DrainRule:
    """The part of a MachineDrainRule the agent needs: name, behavior, order, pods."""
    name = str((rule.get("metadata") or {}).get("name"))
    spec = rule.get("spec") or {}
    drain = spec.get("drain") or {}
    pods = spec.get("pods") or []
    try:
        return DrainRule.model_validate({
            "name": name, "behavior": drain.get("behavior"), "order": drain.get("order") or 0,
            "pods": pods})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        field = {"behavior": "spec.drain.behavior", "order": "spec.drain.order"}.get(
            where, f"spec.{where}" if where else "spec")
        raise DrainRuleError(f"MachineDrainRule {name}: {field}: {first.get('msg')}") from None


def rules_for_machine(rules: Iterable[Mapping[str, Any]], *, namespace: str,
                      machine_labels: Mapping[str, str],
                      cluster_labels: Mapping[str, str]) -> tuple[DrainRule, ...]:
    """The rules of ``namespace`` that apply to the Machine, in name order, as a request
    carries them. Raises :class:`DrainRuleError` for a rule that cannot be applied."""
    mine = sorted((r for r in rules
                   if (r.get("metadata") or {}).get("namespace") == namespace
                   and not (r.get("metadata") or {}).get("deletionTimestamp")),
                  key=lambda r: str((r.get("metadata") or {}).get("name")))
    out = tuple(as_request_rule(r) for r in mine
                if applies_to_machine(r, machine_labels, cluster_labels))
    if len(out) > MAX_DRAIN_RULES:
        raise DrainRuleError(f"{len(out)} MachineDrainRules apply to one Machine; a request "
                             f"carries at most {MAX_DRAIN_RULES}")
    return out


__all__ = ["DrainRuleError", "applies_to_machine", "as_request_rule", "rules_for_machine"]
