"""The tiered, shared KV-cache store: block keys, tiers, policies and trace replay.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.kvcache._block import (
    BLOCK_FORMAT_VERSION,
    LAYOUT_ENGINE_NATIVE,
    LAYOUT_LAYER_KV_TOKEN_HEAD_DIM,
    Block,
    BlockHeader,
    encode_block,
    parse_block,
)
from agentinfra.kvcache._client import AsyncCacheClient, CacheClient
from agentinfra.kvcache._disk_tier import DiskTier
from agentinfra.kvcache._hf import (
    BlockSource,
    PrefillResult,
    PrefixCachedModel,
    random_checkpoint,
    tiny_llama,
)
from agentinfra.kvcache._index import BlockIndex, InsertResult
from agentinfra.kvcache._keys import KEY_SPEC_VERSION, BlockKey, Namespace, block_keys
from agentinfra.kvcache._memory_tier import MemoryTier
from agentinfra.kvcache._policies import (
    POLICIES,
    EvictionPolicy,
    LFUAgingPolicy,
    LRUPolicy,
    PrefixLRUPolicy,
    make_policy,
)
from agentinfra.kvcache._protocol import PROTOCOL_VERSION, Op, ProtocolError, Status
from agentinfra.kvcache._redis_tier import RedisTier
from agentinfra.kvcache._replay import (
    CostModel,
    ReplayResult,
    TraceRequest,
    belady_hit_rate,
    capacity_for_fraction,
    read_trace,
    replay,
    unique_blocks,
)
from agentinfra.kvcache._server import (
    CacheServer,
    ServerConfig,
    ServerThread,
    load_token_file,
    tenant_key,
)
from agentinfra.kvcache._store import (
    EvictionRecord,
    Explanation,
    MissReason,
    Session,
    SessionState,
    StoreStats,
    TieredStore,
)
from agentinfra.kvcache._tier import PutResult, Tier, TierStats
from agentinfra.kvcache._tracegen import AgentTraceConfig, generate_agent_trace, write_trace
from agentinfra.kvcache._vllm_serve import (
    SMOLLM2_NAME,
    VllmServer,
    hermes_chat_template,
    smollm2_dir,
    timed_chat,
    vllm_python,
)

DEFAULT_POLICY = "prefix-lru"
"""The best shipped policy by the replay benchmark (benchmarks/kvcache/RESULTS.md)."""

__all__ = [
    "AgentTraceConfig",
    "AsyncCacheClient",
    "BLOCK_FORMAT_VERSION",
    "Block",
    "BlockHeader",
    "BlockIndex",
    "BlockKey",
    "BlockSource",
    "CacheClient",
    "CacheServer",
    "CostModel",
    "DEFAULT_POLICY",
    "DiskTier",
    "EvictionPolicy",
    "EvictionRecord",
    "Explanation",
    "InsertResult",
    "KEY_SPEC_VERSION",
    "LAYOUT_ENGINE_NATIVE",
    "LAYOUT_LAYER_KV_TOKEN_HEAD_DIM",
    "LFUAgingPolicy",
    "LRUPolicy",
    "MemoryTier",
    "MissReason",
    "Namespace",
    "Op",
    "POLICIES",
    "PROTOCOL_VERSION",
    "PrefillResult",
    "PrefixCachedModel",
    "PrefixLRUPolicy",
    "ProtocolError",
    "PutResult",
    "RedisTier",
    "ReplayResult",
    "SMOLLM2_NAME",
    "ServerConfig",
    "ServerThread",
    "Session",
    "SessionState",
    "Status",
    "StoreStats",
    "Tier",
    "TierStats",
    "TieredStore",
    "TraceRequest",
    "VllmServer",
    "belady_hit_rate",
    "block_keys",
    "capacity_for_fraction",
    "encode_block",
    "generate_agent_trace",
    "hermes_chat_template",
    "load_token_file",
    "make_policy",
    "parse_block",
    "random_checkpoint",
    "read_trace",
    "replay",
    "smollm2_dir",
    "tenant_key",
    "timed_chat",
    "tiny_llama",
    "unique_blocks",
    "vllm_python",
    "write_trace",
]
