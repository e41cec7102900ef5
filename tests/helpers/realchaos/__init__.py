"""Seeded chaos on the real test world: real kube-apiservers and etcd, real controller and
agent processes, faults by seed, an independent watcher (docs/reliability.md)."""
