"""What an engine's KV blocks hold, per attention layout, and whether the connector serves it exactly.

vLLM describes its KV cache as groups of layers sharing one block table, each
with a spec (`vllm.v1.kv_cache_interface`): full attention (MHA/GQA, and
sliding-window layers stored whole when the hybrid allocator is off), MLA
latents, Mamba/linear-attention state, sparse-attention indexer keys, and more.
The connector stores a block as every registered layer's block interior, so it
is exact only when one group holds every layer and that group's blocks are the
whole state of their tokens. `KVLayout.refusal` says, in one line naming the
family, why any other layout is not served: the engine then stops at start
instead of loading part of a block's state (decision 0030).

`KVLayout.label` goes into every key's namespace: blocks never cross layouts
(a sliding window changes every later layer's KV, so it is part of the label).

No vLLM here: the glue (`_vllm.py`) turns vLLM's specs into `KVGroup`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["SERVED_KINDS", "SERVED_QUANT", "KVGroup", "KVLayout"]

SERVED_KINDS = {"FullAttentionSpec": "full", "MLAAttentionSpec": "mla"}
"""The group specs whose blocks are a token range's whole state, by their short name."""

SERVED_QUANT = {"NONE", "FP8_PER_TENSOR"}
"""KV quantisation modes whose blocks are the tokens' whole state: FP8 with one scale per
layer keeps its scale on the layer, set from the checkpoint (covered by the weights identity
in every key) or 1.0, so the block's bytes are all there is to store. Per-token-head modes
keep scales beside the blocks, and packed modes (NVFP4, TurboQuant, ...) are refused."""

_FAMILIES = {
    "MambaSpec": "a hybrid model with Mamba or linear-attention state (Qwen3-Next, Jamba, ...)",
    "SlidingWindowSpec": "sliding-window layers in their own block table (hybrid allocator on)",
    "SlidingWindowMLASpec": "sliding-window MLA layers",
    "ChunkedLocalAttentionSpec": "chunked local attention (Llama 4)",
    "CircularBufferSpec": "circular-buffer attention",
    "SinkFullAttentionSpec": "attention with sink tokens",
    "RSWASpec": "recurrent sliding-window attention",
    "HiSparseHotSpec": "sparse attention with an indexer (DeepSeek-V3.2 style)",
    "HiSparseResidentSpec": "sparse attention with an indexer (DeepSeek-V3.2 style)",
    "HiddenStateCacheSpec": "hidden-state caches (speculative decoding drafts)",
    "CrossAttentionSpec": "encoder-decoder cross attention",
    "EncoderOnlyAttentionSpec": "encoder-only attention",
    "UniformTypeKVCacheSpecs": "layers of one kind with different shapes",
}


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One vLLM KV cache group: its spec's class and what the connector needs of it."""

    kind: str
    """The spec's class name (``FullAttentionSpec``, ``MLAAttentionSpec``, ``MambaSpec``, ...)."""
    layers: tuple[str, ...]
    block_size: int = 0
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    quant: str = "NONE"
    """The spec's KV quantisation mode (vLLM's ``KVQuantMode`` name)."""
    transfer: bool = True
    """Whether vLLM counts the group as transferable state."""
    role: str = "default"
    eagle: bool = False


@dataclass(frozen=True, slots=True)
class KVLayout:
    """An engine's KV cache groups, in vLLM's order."""

    groups: tuple[KVGroup, ...]

    @classmethod
    def of(cls, groups: Iterable[KVGroup]) -> KVLayout:
        return cls(tuple(groups))

    @property
    def layers(self) -> tuple[str, ...]:
        return tuple(name for group in self.groups for name in group.layers)

    def describe(self) -> str:
        """The groups in one phrase, e.g. ``1 group: FullAttentionSpec x4 (sliding window 64)``."""
        parts = []
        for group in self.groups:
            extra = []
            if group.sliding_window:
                extra.append(f"sliding window {group.sliding_window}")
            if group.attention_chunk_size:
                extra.append(f"chunk {group.attention_chunk_size}")
            if group.quant != "NONE":
                extra.append(f"quant {group.quant}")
            parts.append(
                f"{group.kind} x{len(group.layers)}" + (f" ({', '.join(extra)})" if extra else "")
            )
        count = len(self.groups)
        return f"{count} group{'s' if count != 1 else ''}: " + " + ".join(parts)

    def refusal(self, *, inexact_context: str | None = None) -> str | None:
        """Why the connector cannot store and load these blocks exactly; None when it can.

        ``inexact_context`` is the glue's reason, when it has one, why this engine's
        attention over loaded context is not what its own prefill computes (vLLM
        turns prefix caching off for such a backend): stored blocks would be exact,
        the output from them would not.
        """
        if not self.groups:
            return "the engine reports no KV cache groups"
        kinds = {group.kind for group in self.groups}
        unknown = sorted(kind for kind in kinds if kind not in SERVED_KINDS)
        if unknown:
            family = _FAMILIES.get(unknown[0], f"the KV cache spec {unknown[0]}")
            return (
                f"AgentinfraConnector does not serve {family}: {self.describe()}; its blocks would "
                "be stored without the state beside them. Serve this model without the connector"
            )
        if len(self.groups) > 1:
            return (
                f"AgentinfraConnector serves one KV cache group and this engine has "
                f"{self.describe()}; start vLLM with --disable-hybrid-kv-cache-manager or "
                "without the connector"
            )
        group = self.groups[0]
        if group.quant not in SERVED_QUANT:
            return (
                f"AgentinfraConnector does not store quantised KV with scales beside its blocks "
                f"({self.describe()}); use --kv-cache-dtype auto or fp8 (per-tensor), or no connector"
            )
        if not group.transfer or group.role != "default" or group.eagle:
            return f"AgentinfraConnector's one KV cache group is not transferable state ({self.describe()})"
        if inexact_context:
            return (
                f"AgentinfraConnector does not serve {self.describe()} on this engine: "
                f"{inexact_context}. Serve this model without the connector"
            )
        return None

    def label(self) -> str:
        """This layout in a key's namespace (empty for plain full attention, as before 0030)."""
        parts = []
        for group in self.groups:
            short = SERVED_KINDS.get(group.kind, group.kind)
            if group.sliding_window:
                short += f"-sw{group.sliding_window}"
            if group.attention_chunk_size:
                short += f"-chunk{group.attention_chunk_size}"
            parts.append(short)
        return "" if parts == ["full"] else "+".join(parts)
