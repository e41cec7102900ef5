"""Mutual exclusion: which path drives a cluster (extension_active)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.contract.selectors import selector_matches
from fleet.extension.activation import (
    ExtensionEndpoint,
    ExtensionMode,
    extension_active,
)

CLUSTER = {"metadata": {"name": "prod-eu1", "namespace": "fleet-prod"}}
US = ExtensionEndpoint(service_name="k0s-fleet-extension", service_namespace="k0s-fleet-system")


def ext_config(name: str = "k0s-fleet", *, service: tuple[str, str] | None = None,
               url: str | None = None, selector: dict[str, Any] | None = None,
               handlers: list[str] | None = None) -> dict[str, Any]:
    client: dict[str, Any] = {}
    if url:
        client["url"] = url
    else:
        svc = service or ("k0s-fleet-extension", "k0s-fleet-system")
        client["service"] = {"name": svc[0], "namespace": svc[1], "port": 443}
    hooks = {"can-update-machine": "CanUpdateMachine",
             "can-update-machineset": "CanUpdateMachineSet",
             "update-machine": "UpdateMachine"}
    names = hooks if handlers is None else handlers
    spec: dict[str, Any] = {"clientConfig": client}
    if selector is not None:
        spec["namespaceSelector"] = selector
    return {
        "apiVersion": "runtime.cluster.x-k8s.io/v1beta2", "kind": "ExtensionConfig",
        "metadata": {"name": name}, "spec": spec,
        "status": {"handlers": [
            {"name": f"{h}.{name}", "requestHook": {
                "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "hook": hooks[h]},
             "timeoutSeconds": 10, "failurePolicy": "Fail"} for h in names]},
    }


def test_modes() -> None:
    assert not extension_active(CLUSTER, [ext_config()], ExtensionMode.NEVER)
    assert extension_active(CLUSTER, [], ExtensionMode.ALWAYS)
    assert extension_active(CLUSTER, [ext_config()], "auto")
    assert not extension_active(CLUSTER, [], "auto")
    with pytest.raises(ValueError):
        extension_active(CLUSTER, [], "sometimes")


def test_auto_needs_discovery_of_our_update_machine_handler() -> None:
    assert not extension_active(CLUSTER, [ext_config(handlers=[])], "auto")
    assert not extension_active(CLUSTER, [ext_config(handlers=["can-update-machineset"])], "auto")
    not_discovered = ext_config()
    del not_discovered["status"]
    assert not extension_active(CLUSTER, [not_discovered], "auto")
    # Handler names are registered as <handler>.<ExtensionConfig name>.
    renamed = ext_config("other")
    renamed["metadata"]["name"] = "k0s-fleet"
    assert not extension_active(CLUSTER, [renamed], "auto")


def test_auto_needs_the_config_to_point_at_us() -> None:
    theirs = ext_config("k0smotron", service=("k0smotron-extension", "k0smotron"))
    assert not extension_active(CLUSTER, [theirs], "auto", endpoint=US)
    assert extension_active(CLUSTER, [theirs, ext_config()], "auto", endpoint=US)
    # Without a known endpoint, any config registering our handler names counts.
    assert extension_active(CLUSTER, [theirs], "auto")
    by_url = ExtensionEndpoint(url="https://fleet.example.com:9443/x")
    assert extension_active(CLUSTER, [ext_config(url="https://fleet.example.com:9443/x/")],
                            "auto", endpoint=by_url)
    assert not extension_active(CLUSTER, [ext_config(url="https://fleet.example.com/x")],
                                "auto", endpoint=by_url)


def test_auto_honours_the_namespace_selector() -> None:
    by_name = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                     "values": ["fleet-prod"]}]}
    assert extension_active(CLUSTER, [ext_config(selector=by_name)], "auto")
    other = {"metadata": {"name": "x", "namespace": "fleet-dev"}}
    assert not extension_active(other, [ext_config(selector=by_name)], "auto")
    by_label = {"matchLabels": {"k0s-fleet.io/in-place": "capi"}}
    assert not extension_active(CLUSTER, [ext_config(selector=by_label)], "auto")
    assert extension_active(CLUSTER, [ext_config(selector=by_label)], "auto",
                            namespace_labels={"k0s-fleet.io/in-place": "capi"})
    assert extension_active(CLUSTER, [ext_config(selector={})], "auto")


@pytest.mark.parametrize("expr, labels, expected", [
    ({"key": "a", "operator": "In", "values": ["1", "2"]}, {"a": "2"}, True),
    ({"key": "a", "operator": "In", "values": ["1"]}, {}, False),
    ({"key": "a", "operator": "NotIn", "values": ["1"]}, {}, True),
    ({"key": "a", "operator": "NotIn", "values": ["1"]}, {"a": "1"}, False),
    ({"key": "a", "operator": "Exists"}, {"a": ""}, True),
    ({"key": "a", "operator": "DoesNotExist"}, {"a": ""}, False),
    ({"key": "a", "operator": "Gt", "values": ["1"]}, {"a": "2"}, False),
])
def test_selector_expressions(expr: dict[str, Any], labels: dict[str, str],
                              expected: bool) -> None:
    assert selector_matches({"matchExpressions": [expr]}, labels) is expected


@given(labels=st.dictionaries(st.sampled_from("abc"), st.sampled_from("xy"), max_size=3),
       wanted=st.dictionaries(st.sampled_from("abc"), st.sampled_from("xy"), max_size=3))
def test_match_labels_is_a_subset_test(labels: dict[str, str], wanted: dict[str, str]) -> None:
    assert selector_matches({"matchLabels": wanted}, labels) == \
        (wanted.items() <= labels.items())
