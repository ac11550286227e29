"""Problem environments and their graders (kernels first, desktop later).

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

__all__: list[str] = []
