"""Engine adapter for Hugging Face transformers: skip the prefill of a cached prefix.

`PrefixCachedModel.prefill(token_ids)`:

1. computes the block keys of the prompt and asks the source (a `TieredStore` in
   process, or a `CacheClient` of the cache server) for the verified leading run,
   capped so that at least one token is always computed (its logits are needed);
2. loads those blocks into a `transformers.DynamicCache` (block layout
   ``[layers, 2, tokens, kv_heads, head_dim]`` -> per layer ``[1, kv_heads, tokens, head_dim]``);
3. runs the model on the remaining tokens only;
4. saves the prompt's new full blocks back to the source.

Works with decoder-only models whose cache is one K and one V tensor per layer
(Llama, Qwen2, Mistral, ...); the block dtype is the model's dtype.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentinfra.errors import ConfigError
from agentinfra.kvcache import Block, BlockKey, Namespace, block_keys, encode_block

if TYPE_CHECKING:
    import torch

__all__ = ["BlockSource", "PrefillResult", "PrefixCachedModel", "random_checkpoint", "tiny_llama"]


class BlockSource(Protocol):
    """What the adapter needs: `TieredStore` and `CacheClient` both provide it."""

    def leading_hits(self, keys: Sequence[BlockKey]) -> int: ...

    def get(self, keys: Sequence[BlockKey]) -> list[Block]: ...

    def put_encoded(self, items: Sequence[tuple[BlockKey, bytes]]) -> int: ...


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """One prefill: the last position's logits, the filled cache and where the time went."""

    logits: torch.Tensor
    """Logits of the last prompt token (vocab,)."""
    cache: Any
    """The `transformers.DynamicCache` holding the whole prompt."""
    prompt_tokens: int
    cached_tokens: int
    load_s: float
    compute_s: float
    save_s: float
    saved_blocks: int

    @property
    def ttft_s(self) -> float:
        """Time to first token: loading the prefix plus computing the rest."""
        return self.load_s + self.compute_s


class PrefixCachedModel:
    """A causal LM whose prompt prefill reuses KV blocks from a `BlockSource`."""

    def __init__(
        self, model: Any, source: BlockSource, namespace: Namespace, *, save: bool = True
    ) -> None:
        config = model.config
        self.model = model
        self.source = source
        self.namespace = namespace
        self.save = save
        self.layers = int(config.num_hidden_layers)
        self.kv_heads = int(
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        )
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        dtype = str(model.dtype).removeprefix("torch.")
        if namespace.kv_dtype != dtype:
            raise ConfigError(
                f"namespace kv_dtype={namespace.kv_dtype!r} but the model runs in {dtype!r}; "
                "use Namespace(kv_dtype=...) matching the model"
            )

    def prefill(self, token_ids: Sequence[int] | torch.Tensor) -> PrefillResult:
        import torch
        from transformers import DynamicCache

        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        if ids.numel() == 0:
            raise ConfigError("prefill needs at least one token")
        size = self.namespace.block_size_tokens
        keys = block_keys(self.namespace, ids.numpy())
        started = time.perf_counter()
        hits = self.source.leading_hits(keys) if keys else 0
        blocks = self.source.get(keys[:hits]) if hits else []
        for block in blocks:
            self._check_geometry(block)
        # At least the last token is computed (its logits are the point): a fully
        # cached prompt loads every block and drops the last token's K/V.
        cached = min(len(blocks) * size, ids.numel() - 1)
        cache = DynamicCache(config=self.model.config)
        if cached:
            tensors = [b.as_torch() for b in blocks]
            for layer in range(self.layers):
                k = torch.cat([t[layer, 0] for t in tensors])[:cached]
                v = torch.cat([t[layer, 1] for t in tensors])[:cached]
                cache.update(
                    k.permute(1, 0, 2).unsqueeze(0), v.permute(1, 0, 2).unsqueeze(0), layer
                )
        loaded = time.perf_counter()
        with torch.inference_mode():
            out = self.model(input_ids=ids[cached:].unsqueeze(0), cache=cache, use_cache=True)
        computed = time.perf_counter()
        saved = self._save(cache, keys, len(blocks)) if self.save else 0  # the forward filled it
        return PrefillResult(
            logits=out.logits[0, -1],
            cache=cache,
            prompt_tokens=int(ids.numel()),
            cached_tokens=cached,
            load_s=loaded - started,
            compute_s=computed - loaded,
            save_s=time.perf_counter() - computed,
            saved_blocks=saved,
        )

    def _check_geometry(self, block: Block) -> None:
        h = block.header
        if (h.num_layers, h.num_kv_heads, h.head_dim) != (
            self.layers,
            self.kv_heads,
            self.head_dim,
        ):
            raise ConfigError(
                f"cached block has geometry layers={h.num_layers} kv_heads={h.num_kv_heads} head_dim={h.head_dim}, "
                f"the model {self.layers}/{self.kv_heads}/{self.head_dim}: the namespace's model_id must name the model"
            )

    def _save(self, cache: Any, keys: Sequence[BlockKey], first: int) -> int:
        import torch

        size = self.namespace.block_size_tokens
        if first >= len(keys):
            return 0
        items: list[tuple[BlockKey, bytes]] = []
        for index in range(first, len(keys)):
            span = slice(index * size, (index + 1) * size)
            per_layer = [
                torch.stack(
                    (
                        layer.keys[0, :, span].permute(1, 0, 2),
                        layer.values[0, :, span].permute(1, 0, 2),
                    )
                )
                for layer in cache.layers[: self.layers]
            ]
            items.append((keys[index], encode_block(keys[index], torch.stack(per_layer))))
        self.source.put_encoded(items)
        return len(items)


def tiny_llama(
    *,
    layers: int = 24,
    hidden: int = 896,
    heads: int = 14,
    kv_heads: int = 2,
    intermediate: int = 4864,
    vocab: int = 32000,
    seed: int = 0,
    initializer_range: float = 0.02,
) -> Any:
    """A Llama-architecture causal LM built from a config with random weights (no download).

    The defaults are the ~0.5B geometry of issue 7 (Qwen2-0.5B's shape, a smaller vocabulary).
    A larger ``initializer_range`` (0.2) gives peaked logits, so that wrong KV visibly
    changes the greedy tokens (at 0.02 the logits are nearly flat).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=32768,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.train(False)
    return model


def random_checkpoint(path: Any, *, initializer_range: float = 0.2, **geometry: Any) -> Any:
    """`tiny_llama` saved as a Hugging Face checkpoint directory (float32 safetensors) that vLLM can load.

    Returns the directory. ``geometry``: `tiny_llama`'s keyword arguments.
    """
    from pathlib import Path

    target = Path(path)
    model = tiny_llama(initializer_range=initializer_range, **geometry)
    model.save_pretrained(target)
    return target
