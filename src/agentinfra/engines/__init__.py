"""Inference engines over the KV-cache store: the transformers adapter and vLLM, served and plugged in.

- `PrefixCachedModel` (transformers): a prefill that loads a cached prefix from a
  `BlockSource` (a `agentinfra.kvcache.TieredStore` or `CacheClient`) and saves
  the new blocks back; `tiny_llama` and `random_checkpoint` build models without
  a download.
- `VllmServer`: vLLM's OpenAI-compatible server as a child process, run by vLLM's
  own interpreter (`vllm_python`), optionally with agentinfra's connector under
  it; `smollm2_dir` finds the checkpoint `make smollm2` prepares, and
  `hermes_chat_template` is the ChatML + Hermes tools template it is served with.
- `agentinfra.engines.vllm`: the vLLM v1 KV connector itself, the module vLLM
  loads (``kv_connector_module_path``). It imports vLLM, so it is not imported
  here; its planning (keys, loads, saves, waits, session hints) is plain code
  over token and block ids, tested without vLLM.

This package may use `agentinfra.kvcache`; the cache never imports an engine.
Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.engines._hf import (
    BlockSource,
    PrefillResult,
    PrefixCachedModel,
    random_checkpoint,
    tiny_llama,
)
from agentinfra.engines._vllm_serve import (
    SMOLLM2_NAME,
    VllmServer,
    hermes_chat_template,
    smollm2_dir,
    timed_chat,
    vllm_python,
)

__all__ = [
    "BlockSource",
    "PrefillResult",
    "PrefixCachedModel",
    "SMOLLM2_NAME",
    "VllmServer",
    "hermes_chat_template",
    "random_checkpoint",
    "smollm2_dir",
    "timed_chat",
    "tiny_llama",
    "vllm_python",
]
