from hypothesis import given
from hypothesis import strategies as st

from fleet.contract.nodeplan import build_nodeplan, label_value, nodeplan_name


def test_name_is_deterministic_across_spellings() -> None:
    assert nodeplan_name("m-1", "v1.31.3") == nodeplan_name("m-1", "v1.31.3-k0s.0")
    assert nodeplan_name("m-1", "v1.31.3+k0s.0") == "m-1-v1.31.3-k0s.0"
    assert nodeplan_name("m-1", "v1.31.3+k0s.1") != nodeplan_name("m-1", "v1.31.3+k0s.0")


@given(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,300}[a-z0-9])?", fullmatch=True))
def test_names_and_labels_fit(machine: str) -> None:
    name = nodeplan_name(machine, "v1.31.3")
    assert len(name) <= 253
    label = label_value(machine)
    assert len(label) <= 63
    assert label == "" or (label[0].isalnum() and label[-1].isalnum())


def test_build_sets_owner_and_spec() -> None:
    machine = {"metadata": {"name": "w-1", "namespace": "ns", "uid": "u-1"},
               "spec": {"clusterName": "c1"}}
    tp = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    plan = build_nodeplan(machine=machine, node_name="w-1", role="worker", version="1.31.3",
                          url="https://x/k0s", sha256=None, traceparent=tp)
    assert plan["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert plan["spec"]["version"] == "v1.31.3+k0s.0"
    assert plan["metadata"]["annotations"]["tracing.k8s.io/traceparent"].startswith("00-")


def test_long_names_are_valid_dns_subdomains_wherever_they_are_cut() -> None:
    import re  # noqa: PLC0415
    label = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    for n in range(200, 253):
        for sep in ".-":
            machine = ("a" * n + sep + "b" * 30)[:250]
            name = nodeplan_name(machine, "v1.31.3+k0s.0")
            assert len(name) <= 253
            assert all(label.match(part) for part in name.split(".")), name[-40:]
