"""agentinfra: infrastructure for running AI agents at scale.

Importing the package stays cheap: it holds the version only. Components live in
subpackages (`kvcache`, `engines`, `sandbox`, `environments`, `agent`, `harness`, `cli`).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
