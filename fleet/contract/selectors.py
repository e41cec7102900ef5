"""Kubernetes label selectors: the one implementation, for the fleet config (cluster
discovery, waves) and for CAPI's ExtensionConfig ``namespaceSelector``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Self

from pydantic import Field, ValidationError, model_validator

from fleet.contract.kubenames import ConfigModel, LabelKey, LabelValue, label_key, label_value
from fleet.contract.problems import Problems, pydantic_message


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(ConfigModel):
    key: LabelKey = Field(description="The label key the requirement applies to.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[LabelValue] = Field(
        default_factory=list,
        description="Values for In / NotIn (non-empty); must be empty for Exists / DoesNotExist.",
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Self:
        has_values = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if has_values and not self.values:
            raise Problems([(("values",), f"must not be empty for operator {self.operator}")])
        if not has_values and self.values:
            raise Problems([(("values",), f"must be empty for operator {self.operator}")])
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        match self.operator:
            case SelectorOperator.IN:
                return present and labels[self.key] in self.values
            case SelectorOperator.NOT_IN:
                return not present or labels[self.key] not in self.values
            case SelectorOperator.EXISTS:
                return present
            case SelectorOperator.DOES_NOT_EXIST:
                return not present


class LabelSelector(ConfigModel):
    """A Kubernetes label selector. An empty selector matches every cluster."""

    match_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, description="Labels that must all be present with these values."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Set-based requirements; all must hold."
    )

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


_SELECTOR_TERM = re.compile(
    r"""\s*(?:
        (?P<not>!)\s*(?P<nkey>[^\s!=,()]+)
      | (?P<skey>[^\s!=,()]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)
      | (?P<ekey>[^\s!=,()]+)\s*(?P<eq>==|=|!=)\s*(?P<val>[^\s!=,()]*)
      | (?P<xkey>[^\s!=,()]+)
    )\s*(?:,|$)""",
    re.VERBOSE,
)


def parse_label_selector(text: str) -> LabelSelector:
    """Parse the string form of a label selector (``a=b,c!=d,e in (x,y),!f,g``), as
    given to ``kubectl -l`` or the API's ``labelSelector`` parameter."""
    match_labels: dict[str, str] = {}
    exprs: list[LabelSelectorRequirement] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _SELECTOR_TERM.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot parse label selector {text!r} at {text[pos:]!r}")
        pos = m.end()
        if m["nkey"]:
            exprs.append(_requirement(m["nkey"], SelectorOperator.DOES_NOT_EXIST, []))
        elif m["skey"]:
            vals = [v.strip() for v in m["vals"].split(",") if v.strip()]
            op = SelectorOperator.IN if m["op"] == "in" else SelectorOperator.NOT_IN
            exprs.append(_requirement(m["skey"], op, vals))
        elif m["ekey"]:
            key, val = label_key(m["ekey"]), label_value(m["val"])
            if m["eq"] == "!=":
                exprs.append(_requirement(key, SelectorOperator.NOT_IN, [val]))
            elif match_labels.get(key, val) != val:
                raise ValueError(f"label selector {text!r} requires {key} to be two values")
            else:
                match_labels[key] = val
        else:
            exprs.append(_requirement(m["xkey"], SelectorOperator.EXISTS, []))
    return LabelSelector(match_labels=match_labels, match_expressions=exprs)


def _requirement(key: str, op: SelectorOperator, values: list[str]) -> LabelSelectorRequirement:
    try:
        return LabelSelectorRequirement(key=key, operator=op, values=values)
    except ValidationError as e:
        raise ValueError("; ".join(pydantic_message(err) for err in e.errors())) from None


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector as found in an object (camelCase mapping) against a label
    set; None or empty selects everything. One that does not validate (an unknown
    operator, values where none belong) selects nothing: fail closed."""
    if not selector:
        return True
    try:
        parsed = LabelSelector.model_validate(selector, by_alias=True)
    except ValidationError:
        return False
    return parsed.matches(labels)
