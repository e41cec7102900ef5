"""The controller's view of the world: compact records of what the watches saw
(``records``, ``kept``), the immutable snapshot they build (``model``, ``snapshot``), the
pure rules that judge it (eligibility, budget, executors, intents, fences, drain rules),
and the workload-cluster clients that feed it (``clusters``)."""
