"""Reconcilers: watch the management and workload clusters, plan, dispatch."""
