"""The vLLM v1 KV connector, importable by vLLM as ``kv_connector_module_path: agentinfra.kvcache.vllm``.

Needs vLLM in the interpreter (the ``.venv/vllm`` of ``make vllm-venv``); the
rest of `agentinfra.kvcache` does not import it. Design: `agentinfra.kvcache._vllm`
and docs/decisions/0010-vllm-connector.md.
"""

from agentinfra.kvcache._vllm import (
    AgentinfraConnector,
    AgentinfraConnectorMetadata,
    ConnectorCounters,
    ConnectorSettings,
    layout_label,
)

__all__ = [
    "AgentinfraConnector",
    "AgentinfraConnectorMetadata",
    "ConnectorCounters",
    "ConnectorSettings",
    "layout_label",
]
