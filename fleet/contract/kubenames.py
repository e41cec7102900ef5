"""Kubernetes' own syntax: object names, DNS labels, label keys and values; and
:class:`ConfigModel`, the strict camelCase base of every Kubernetes-shaped model here
(the fleet configuration's, label selectors', drain rules')."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ConfigModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _dns_label(v: str) -> str:
    if len(v) > 63 or not _DNS_LABEL.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid DNS label (lowercase a-z, 0-9, '-', <= 63)")
    return v


def _dns_subdomain(v: str) -> str:
    if len(v) > 253 or not _DNS_SUBDOMAIN.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid Kubernetes object name (DNS subdomain)")
    return v


def label_key(v: str) -> str:
    prefix, slash, name = v.rpartition("/")
    if (
        (slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)))
        or len(name) > 63
        or not _LABEL_NAME.fullmatch(name)
    ):
        raise ValueError(f"{v!r} is not a valid label key")
    return v


def label_value(v: str) -> str:
    if v and (len(v) > 63 or not _LABEL_NAME.fullmatch(v)):
        raise ValueError(f"{v!r} is not a valid label value")
    return v


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
ObjectName = Annotated[str, AfterValidator(_dns_subdomain)]
LabelKey = Annotated[str, AfterValidator(label_key)]
LabelValue = Annotated[str, AfterValidator(label_value)]
