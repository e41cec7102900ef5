"""The test world: real etcd + kube-apiservers, simulated nodes, a release server.

Used by the tests, the demo and the benchmarks; nothing here runs in production.
"""
