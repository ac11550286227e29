"""The vLLM v1 KV connector, importable by vLLM as ``kv_connector_module_path: agentinfra.engines.vllm``.

Needs vLLM in the interpreter (the ``.venv/vllm`` of ``make vllm-venv``); the
rest of `agentinfra.engines` does not import it. Design: `agentinfra.engines._vllm`
(the glue), `agentinfra.engines._connector_plan` (its planning, without vLLM) and
docs/decisions/0010-vllm-connector.md. The old path ``agentinfra.kvcache.vllm``
still loads the connector.
"""

from agentinfra.engines._vllm import (
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
