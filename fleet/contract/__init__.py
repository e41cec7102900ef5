"""The wire contract: what the controller, the node agent and k0s agree on.

The node signal (the Node annotation and its status), NodePlan naming and body, W3C trace
context, k0s versions and the paths between them, and Kubernetes' own syntax for names and
label selectors. The node agent imports this package and the client layer (``fleet.kube``)
and nothing else of ``fleet`` (``tests/unit/test_layers.py``), which is what keeps it light.
"""
