"""The API resources k0s-fleet reads and writes, described once."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if self.namespaced and namespace is not None:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append(subresource)
        return "/".join(parts)

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


# core
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
EVENTS = Resource("events.k8s.io", "v1", "events", "Event", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                "CustomResourceDefinition", namespaced=False)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)

# Cluster API
CAPI_GROUP = "cluster.x-k8s.io"
CLUSTERS = Resource(CAPI_GROUP, "v1beta2", "clusters", "Cluster", namespaced=True)
MACHINES = Resource(CAPI_GROUP, "v1beta2", "machines", "Machine", namespaced=True)
MACHINE_SETS = Resource(CAPI_GROUP, "v1beta2", "machinesets", "MachineSet", namespaced=True)
# How Machines are drained (Cluster API v1.11+ serves v1beta2): carried in each request
MACHINE_DRAIN_RULES = Resource(CAPI_GROUP, "v1beta2", "machinedrainrules", "MachineDrainRule",
                               namespaced=True)
MACHINE_DEPLOYMENTS = Resource(CAPI_GROUP, "v1beta2", "machinedeployments",
                               "MachineDeployment", namespaced=True)
EXTENSION_CONFIGS = Resource("runtime.cluster.x-k8s.io", "v1beta2", "extensionconfigs",
                             "ExtensionConfig", namespaced=False)

# k0smotron
K0S_CONTROL_PLANES = Resource("controlplane.cluster.x-k8s.io", "v1beta2", "k0scontrolplanes",
                              "K0sControlPlane", namespaced=True)
# k0smotron's hosted control plane (its main mode: the control plane runs as pods in the
# management cluster, no Machines): spec.version, status.version, status.replicas,
# status.readyReplicas
K0SMOTRON_CONTROL_PLANES = Resource("controlplane.cluster.x-k8s.io", "v1beta2",
                                    "k0smotroncontrolplanes", "K0smotronControlPlane",
                                    namespaced=True)
# the worker bootstrap template: spec.template.spec.version, when set, is the k0s version
# new worker Machines install (else the Machine's spec.version)
K0S_WORKER_CONFIG_TEMPLATES = Resource("bootstrap.cluster.x-k8s.io", "v1beta2",
                                       "k0sworkerconfigtemplates", "K0sWorkerConfigTemplate",
                                       namespaced=True)

# k0s autopilot (workload clusters)
AUTOPILOT_GROUP = "autopilot.k0sproject.io"
AUTOPILOT_PLANS = Resource(AUTOPILOT_GROUP, "v1beta2", "plans", "Plan", namespaced=False)
CONTROL_NODES = Resource(AUTOPILOT_GROUP, "v1beta2", "controlnodes", "ControlNode",
                         namespaced=False)

# k0s-fleet
FLEET_GROUP = "fleet.k0s-fleet.io"
NODE_PLANS = Resource(FLEET_GROUP, "v1alpha1", "nodeplans", "NodePlan", namespaced=True)
FLEET_UPGRADES = Resource(FLEET_GROUP, "v1alpha1", "fleetupgrades", "FleetUpgrade",
                          namespaced=True)
