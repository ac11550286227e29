"""Long-horizon runs: journal, submissions, grading queue, metrics and reports.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

__all__: list[str] = []
