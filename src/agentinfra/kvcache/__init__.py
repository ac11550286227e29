"""The tiered, shared KV-cache store: block keys, blocks, tiers, policies, the server and trace replay.

Only the cache's own vocabulary is public here; the engines that use it (the
transformers adapter, the vLLM connector and server) live in `agentinfra.engines`,
and the cache imports none of them. `ProtocolError` is `agentinfra.errors.ProtocolError`.
Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.kvcache._block import (
    BLOCK_FORMAT_VERSION,
    LAYOUT_ENGINE_NATIVE,
    Block,
    BlockHeader,
    encode_block,
    parse_block,
)
from agentinfra.kvcache._block import HEADER_BYTES as BLOCK_HEADER_BYTES
from agentinfra.kvcache._block import checksum as block_checksum
from agentinfra.kvcache._client import AsyncCacheClient, CacheClient, TierHits
from agentinfra.kvcache._disk_tier import DiskTier
from agentinfra.kvcache._events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventsConfig,
    KVEventBatch,
    StoreEvents,
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
from agentinfra.kvcache._protocol import Op, Status
from agentinfra.kvcache._reader import BlockReader
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

DEFAULT_POLICY = "prefix-lru"
"""The best shipped policy by the replay benchmark (benchmarks/kvcache/RESULTS.md)."""

__all__ = [
    "AgentTraceConfig",
    "AllBlocksCleared",
    "AsyncCacheClient",
    "BLOCK_FORMAT_VERSION",
    "BLOCK_HEADER_BYTES",
    "Block",
    "BlockHeader",
    "BlockIndex",
    "BlockKey",
    "BlockReader",
    "BlockRemoved",
    "BlockStored",
    "CacheClient",
    "CacheServer",
    "CostModel",
    "DEFAULT_POLICY",
    "DiskTier",
    "EventsConfig",
    "EvictionPolicy",
    "EvictionRecord",
    "Explanation",
    "InsertResult",
    "KEY_SPEC_VERSION",
    "KVEventBatch",
    "LAYOUT_ENGINE_NATIVE",
    "LFUAgingPolicy",
    "LRUPolicy",
    "MemoryTier",
    "MissReason",
    "Namespace",
    "Op",
    "POLICIES",
    "PrefixLRUPolicy",
    "PutResult",
    "RedisTier",
    "ReplayResult",
    "ServerConfig",
    "ServerThread",
    "Session",
    "SessionState",
    "Status",
    "StoreEvents",
    "StoreStats",
    "Tier",
    "TierHits",
    "TierStats",
    "TieredStore",
    "TraceRequest",
    "belady_hit_rate",
    "block_checksum",
    "block_keys",
    "capacity_for_fraction",
    "encode_block",
    "generate_agent_trace",
    "load_token_file",
    "make_policy",
    "parse_block",
    "read_trace",
    "replay",
    "unique_blocks",
    "write_trace",
]
