"""Fleet-wide rollout policy: waves, soak, failure budgets, windows, pause and stop.

``gate`` is the pure wave engine the controller consults before each dispatch;
``progress`` builds its input from the controller's snapshot; ``state`` is the durable
record kept in the rollout ConfigMap; ``coordinator`` does the gate's I/O (record,
Events); ``plan`` is the dry run behind ``k0s-fleet plan``. (Nothing is imported here,
so that ``k0s-fleet --help`` stays fast.)
"""
