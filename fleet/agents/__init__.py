"""The node agent: performs one node's in-place k0s upgrade when its signal asks.

Modules: ``state`` (pure decisions), ``files``/``download``/``swap`` (the binary on
disk), ``drain`` (cordon, evictions), ``restart`` and ``verify`` (the k0s process),
``agent`` (the watch-driven state machine), ``settings`` (configuration).
"""
