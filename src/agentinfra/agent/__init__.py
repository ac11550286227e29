"""The agent loop over OpenAI-compatible models, tool-call formats and training-data export.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

__all__: list[str] = []
