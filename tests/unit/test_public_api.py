"""Pins every public `__all__`: a change to the public surface must change this file."""

from __future__ import annotations

import importlib

import pytest

EXPECTED: dict[str, list[str]] = {
    "agentinfra": ["__version__"],
    "agentinfra.errors": [
        "AgentError",
        "AgentInfraError",
        "BlockFormatError",
        "ConfigError",
        "HarnessError",
        "KVCacheError",
        "StoreLockedError",
        "TaskEnvironmentError",
        "TierUnavailableError",
        "TraceFormatError",
    ],
    "agentinfra.kvcache": [
        "AgentTraceConfig",
        "BLOCK_FORMAT_VERSION",
        "Block",
        "BlockHeader",
        "BlockIndex",
        "BlockKey",
        "CostModel",
        "DEFAULT_POLICY",
        "DiskTier",
        "EvictionPolicy",
        "EvictionRecord",
        "Explanation",
        "InsertResult",
        "KEY_SPEC_VERSION",
        "LFUAgingPolicy",
        "LRUPolicy",
        "MemoryTier",
        "MissReason",
        "Namespace",
        "POLICIES",
        "PrefixLRUPolicy",
        "PutResult",
        "ReplayResult",
        "Session",
        "SessionState",
        "StoreStats",
        "Tier",
        "TierStats",
        "TieredStore",
        "TraceRequest",
        "belady_hit_rate",
        "block_keys",
        "capacity_for_fraction",
        "encode_block",
        "generate_agent_trace",
        "make_policy",
        "parse_block",
        "read_trace",
        "replay",
        "unique_blocks",
        "write_trace",
    ],
    "agentinfra.harness": [],
    "agentinfra.environments": [],
    "agentinfra.environments.kernels": [
        "Finding",
        "GRADER_VERSION",
        "GradeOptions",
        "Outcome",
        "ProblemMeta",
        "Provenance",
        "Verdict",
        "grade",
        "grade_async",
        "load_problem_meta",
        "probe_sandbox_mode",
        "static_findings",
    ],
    "agentinfra.agent": [],
    "agentinfra.cli": ["app", "main"],
}


@pytest.mark.parametrize("module_name", sorted(EXPECTED))
def test_all_is_pinned_and_sorted(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = list(module.__all__)
    assert exported == EXPECTED[module_name]
    assert exported == sorted(exported)
    for name in exported:
        assert hasattr(module, name), f"{module_name}.__all__ names missing {name}"
