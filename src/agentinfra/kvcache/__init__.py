"""The tiered, shared KV-cache store: block keys, tiers, policies and trace replay.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

__all__: list[str] = []
