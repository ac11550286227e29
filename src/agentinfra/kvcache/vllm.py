"""Old home of the vLLM connector, kept so configs with ``kv_connector_module_path: agentinfra.kvcache.vllm`` still load.

The connector lives in `agentinfra.engines.vllm`; use that path in new configs.
"""

from agentinfra.engines.vllm import AgentinfraConnector as AgentinfraConnector
